"""The core: hook specifications, plugin discovery, configuration."""
