"""Built-in importance sources (`registration` registers them through the same hook as any
third party's): `desktop` (the compositor's focus), `slices` (systemd's slices) and `rules`
(a table of app-id globs)."""
