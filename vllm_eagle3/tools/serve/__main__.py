"""``python -m vllm_eagle3.tools.serve``: the supervised child of ``vllm-eagle3 serve`` (and the command itself)."""

import sys

from .cli import main

sys.exit(main())
