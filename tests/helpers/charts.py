"""Reading back what a chart function drew."""

from __future__ import annotations


def drawn_axes(draw):
    """``draw()`` with matplotlib's ``plt.subplots`` watched: what it returned, and the axes of every figure it
    opened, in order."""
    import matplotlib.pyplot as plt

    opened, original = [], plt.subplots

    def spy(*args, **kwargs):
        figure, axes = original(*args, **kwargs)
        opened.append(axes)
        return figure, axes

    plt.subplots = spy
    try:
        return draw(), opened
    finally:
        plt.subplots = original
