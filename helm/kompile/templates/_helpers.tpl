{{/* Names and labels shared by every template. */}}
{{- define "kompile.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kompile.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kompile.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kompile.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kompile.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kompile.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kompile.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{ include "kompile.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Every Secret the operator may read: the default credentials Secret plus the listed ones. */}}
{{- define "kompile.secretNames" -}}
{{- $names := .Values.artifactStore.credentialsSecrets | default list -}}
{{- with .Values.artifactStore.credentialsSecret }}{{ $names = append $names . }}{{ end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/*
The rules the operator needs where CompiledModels live; a Role per watched namespace, or one
ClusterRole when it watches all. Each verb is one the code calls (kompile/operator/kube.py) or Kopf
needs (watching, its progress annotations, events); nothing else.
*/}}
{{- define "kompile.namespacedRules" -}}
# Kopf lists and watches CompiledModels (and patches away the finalizer an operator before 0.2 put
# on them); reconcile reads each one fresh before acting.
- apiGroups: ["kompile.dev"]
  resources: ["compiledmodels"]
  verbs: ["get", "list", "watch", "patch"]
# The typed status is written only through the status subresource (a merge patch; never read there).
- apiGroups: ["kompile.dev"]
  resources: ["compiledmodels/status"]
  verbs: ["patch"]
# Compile Jobs: created with deterministic names, watched for ends, deleted when superseded.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "list", "watch", "delete"]
# A Job's pods are read for the termination message (the compact result) and the node they ran on.
# Never create: pods are made by the Job controller under its own identity.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
# Kopf and the operator post Events on CompiledModels.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- $secrets := include "kompile.secretNames" . | fromJsonArray }}
{{- if $secrets }}
# Store credentials: only the Secrets named in the values, never list (listing would reveal all).
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: {{ $secrets | toJson }}
  verbs: ["get"]
{{- end }}
{{- if .Values.kserve.enabled }}
# The rollout: InferenceServices are read, created and merge-patched (canary, promote, rollback).
- apiGroups: ["serving.kserve.io"]
  resources: ["inferenceservices"]
  verbs: ["get", "create", "patch"]
{{- end }}
{{- if .Values.kserve.gitopsConfigMaps }}
# GitOps mode writes InferenceService manifests into a ConfigMap: read to see whose it is, created
# when absent, updated only when this CompiledModel owns it (another's is never touched).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "update"]
{{- end }}
{{- end -}}
