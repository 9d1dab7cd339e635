"""The npu-manager conformance suite, run on the Acme driver."""

from npumanager.testing import DriverSuite


class TestAcmeConformance(DriverSuite):
    __test__ = True
    driver_name = "acme"
