import sys

from keysvc.cli import main

sys.exit(main())
