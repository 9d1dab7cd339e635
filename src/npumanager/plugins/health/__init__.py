"""Built-in health sources (`registration` registers them through the same hook as any
third party's): `linux` reads the kernel's PSI memory pressure, thermal zones and the
accelerator's sysfs."""
