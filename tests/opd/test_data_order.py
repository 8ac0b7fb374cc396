"""The data order: a seeded shuffle per epoch, micro-batches, accumulation windows, max_steps, resuming at a cursor."""

from __future__ import annotations

from opd.training.data_order import DataCursor, DataOrder


def test_epoch_order_windows_and_cursor():
    order = DataOrder(5, batch_size=2, accumulation_steps=2, epochs=2, seed=3, max_steps=None)
    assert (order.batches_per_epoch, order.total_steps) == (3, 4)
    windows = list(order.windows())
    assert [w.step for w in windows] == [1, 2, 3, 4] and [w.epoch for w in windows] == [0, 0, 1, 1]
    assert windows[-1].next_cursor == DataCursor(2, 0)
    for epoch in (0, 1):
        shuffled = order.order(epoch)
        assert sorted(shuffled) == list(range(5))
        assert windows[2 * epoch].batches == [shuffled[0:2], shuffled[2:4]]
        assert windows[2 * epoch + 1].batches == [shuffled[4:5]]
    assert order.order(0) != order.order(1) and order.order(0) == DataOrder(
        5, batch_size=1, accumulation_steps=1, epochs=1, seed=3, max_steps=None).order(0)
    resumed = list(order.windows(DataCursor(0, 2), step=1))
    assert [(w.step, w.batches, w.next_cursor) for w in resumed] == [
        (w.step, w.batches, w.next_cursor) for w in windows[1:]]


def test_max_steps_is_the_run_including_resumed_steps_and_overrides_epochs():
    order = DataOrder(10, batch_size=2, accumulation_steps=1, epochs=3, seed=0, max_steps=4)
    assert order.total_steps == 4 and [w.step for w in order.windows()] == [1, 2, 3, 4]
    assert [w.step for w in order.windows(DataCursor(0, 3), step=3)] == [4]
    assert list(order.windows(DataCursor(0, 4), step=4)) == []
    # more steps than the epochs give: the order goes on into further epochs (transformers' Trainer), not silently
    # stopping at 5 steps; 8 records at batch 4 give 2 steps an epoch, so max_steps=3 is 2 epochs' order, cut after 3
    longer = DataOrder(8, batch_size=4, accumulation_steps=1, epochs=1, seed=0, max_steps=3)
    windows = list(longer.windows())
    assert longer.total_steps == 3 and [(w.step, w.epoch) for w in windows] == [(1, 0), (2, 0), (3, 1)]
    assert windows[2].batches == [longer.order(1)[:4]] and windows[2].next_cursor == DataCursor(1, 1)
