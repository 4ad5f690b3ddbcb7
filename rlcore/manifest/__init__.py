"""The TOML manifest: core tables, loading with overrides, validation, JSON Schema."""

from rlcore.manifest.loader import ResolvedManifest, load_manifest

__all__ = ["ResolvedManifest", "load_manifest"]
