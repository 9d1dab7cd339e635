from setuptools import setup

setup(cffi_modules=["src/npumanager/vendor_drivers/vnpu/_build.py:ffibuilder"])
