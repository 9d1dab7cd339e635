"""The plugin framework: hook specifications, discovery and registries,
configuration files, and the health-source contract."""
