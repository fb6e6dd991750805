"""Real servers for the tests (an S3-compatible server, an MLflow tracking server) and their fixtures."""
