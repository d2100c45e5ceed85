"""Plugin options declared with their types, bounds and parsers, checked before any work.

A plugin declares each option once; the runner checks every value (type, bounds, choices, parser)
before the model loads, the CLI builds its ``--help`` from the same declaration, and a bad value
is one line naming the flag, the value and the fix:

>>> from mechkit.options import NumberList, Option
>>> opt = Option("sweep", str, None, "Comma-separated k values.", parse=NumberList(int, min=1, sort=True))
>>> opt.check("20,5")
('20,5', (5, 20))
>>> opt.flag, opt.help_extra()
('--sweep', ['each x>=1'])
"""

from mechkit.options.execution import EXECUTION, ExecutorChoice, RayAddress
from mechkit.options.option import Bounds, Option, OptionError
from mechkit.options.parsers import (
           DEFAULT_TASKS,
           Choices,
           ExistingPath,
           Grid,
           HeadSpec,
           IntRanges,
           NumberList,
           OrAuto,
           Paths,
           Ranges,
           TaskList,
           Text,
           parse_lambdas,
)
from mechkit.options.pruning import GuideList, Levels, SparsityLevels, TargetList

__all__ = ["DEFAULT_TASKS", "EXECUTION", "Bounds", "Choices", "ExecutorChoice", "ExistingPath", "Grid", "GuideList",
           "HeadSpec", "IntRanges", "Levels", "NumberList", "Option", "OptionError", "OrAuto", "Paths", "Ranges", "RayAddress",
           "SparsityLevels", "TargetList", "TaskList", "Text", "parse_lambdas"]
