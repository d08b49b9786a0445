import sys

from flowstream.cli import main

sys.exit(main())
