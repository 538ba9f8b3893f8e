"""`doctor`: the host, the model and the settings checked before a start, in one
report. Imports every wing below it."""
