"""The pipeline that runs inside a compile Job's pod (and in `kompile run`). Never imports kopf."""
