"""`python -m toolkit.cli`: the `pdlab` command line without its console script."""

from toolkit.cli.main import app

if __name__ == "__main__":  # not when a package walk imports it
    app()
