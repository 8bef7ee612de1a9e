import sys

from mlxspec.cli.main import main

sys.exit(main())
