"""kompile: compile one trained model for every kind of hardware in a fleet."""

__version__ = "0.1.0"
