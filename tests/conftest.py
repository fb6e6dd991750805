"""Suite-wide plugins: the real S3 (versitygw) and MLflow servers, started on first use."""

pytest_plugins = ["tests.support.fixtures"]
