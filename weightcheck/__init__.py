"""weightcheck: are the weights you are about to serve the weights you meant to serve?"""

__version__ = "0.1.0"
