"""The driver side: the `Driver` contract, its events and debouncer, and the
device scheduler (bands, fair share, floors) every driver shares."""
