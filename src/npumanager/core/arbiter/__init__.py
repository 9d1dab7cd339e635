"""The decisions: a pure state machine (time passed in, no I/O), its state
table, the policy API and the actions it returns."""
