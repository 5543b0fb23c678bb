"""`python -m provisioner` runs the CLI."""

from provisioner.cli import main

main()
