"""The app's side: `NpuManager`, its callbacks, leases, and callback delivery."""
