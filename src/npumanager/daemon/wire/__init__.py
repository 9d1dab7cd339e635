"""The daemon's protocol, shared by both ends: frames, messages, tensors, lanes
and the version."""
