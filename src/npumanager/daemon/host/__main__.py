"""`python -m npumanager.daemon.host SETTINGS`: a model host (`process.main`)."""

from npumanager.daemon.host.process import main

main()
