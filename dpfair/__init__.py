"""dpfair: differentially private training that removes DP's disparate impact on groups.

``dpfair.fit`` (:func:`dpfair.api.fit`) trains your own ``nn.Module``; it is loaded on first
use, so ``import dpfair`` loads no torch.
"""

from dpfair.lazy import lazy_getattr

__version__ = "0.1.0"
__all__ = ["fit"]

__getattr__ = lazy_getattr(__name__, {"fit": "api"})
