"""The one home of Kubernetes API access (besides kopf): client configuration, raw calls, the informer."""
