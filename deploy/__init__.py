"""Deployment helpers (the GPU check); the manifests and configs beside this file are not Python."""
