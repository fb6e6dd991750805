-- Argo CD health check for kompile.dev/CompiledModel.
-- Progressing while the operator has not observed the current generation or targets still compile,
-- Suspended when spec.suspend holds new compiles, Healthy when Ready, Degraded when Ready is False.
local hs = {}
local generation = obj.metadata and obj.metadata.generation or 0
local status = obj.status

if status == nil or status.observedGeneration == nil or status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local ready = nil
if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == "Ready" then
      ready = c
    end
  end
end

local running = 0
local total = 0
if status.targets ~= nil then
  for _, t in ipairs(status.targets) do
    total = total + 1
    if t.phase == "Pending" or t.phase == "Running" then
      running = running + 1
    end
  end
end

if obj.spec ~= nil and obj.spec.suspend == true and running > 0 then
  hs.status = "Suspended"
  hs.message = "spec.suspend is true: " .. tostring(running) .. " target(s) wait for compile"
  return hs
end

if running > 0 or ready == nil or ready.status == "Unknown" then
  hs.status = "Progressing"
  hs.message = tostring(total - running) .. "/" .. tostring(total) .. " targets finished"
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
else
  hs.status = "Degraded"
end
hs.message = (ready.reason or "") .. ": " .. (ready.message or "")
return hs
