"""Result sets against each other: the regression gate of compare, and history over a series of sets."""
