"""The Kopf operator. Never imports torch or a compiler."""
