"""The Kubernetes backend: presets, pod requests by mode, manifests (pure), and the cluster I/O."""
