"""Training: policy log-probs, micro-batch gradients, fixed-order reduction, optimizer step.

This package is also the Python API's `poise.train(config, **overrides) -> RunResult`
(poise/api.py `train`): a function named `train` on the `poise` package would be replaced by this
package as soon as any of its modules is imported, so the package itself is callable.
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, config=None, **overrides):
        """poise.api.train: run RL post-training as `poise train` does; returns a RunResult."""
        from poise.api import train

        return train(config, **overrides)


sys.modules[__name__].__class__ = _CallablePackage
