import sys

from padres.cli import main

sys.exit(main())
