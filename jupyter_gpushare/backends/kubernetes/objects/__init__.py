"""The Kubernetes objects of a kernel, built without the API client: pod requests, manifests,
claims, presets, and the pool, statuses and usage read from listed objects. Pure."""
