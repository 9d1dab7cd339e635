"""Which running job to stop when the next one should not wait (restart preemption).

Two reasons stop a job, each only when every channel is busy:

- **A more important band waits** (`by_band`): the least important running job, the
  latest started of those, unless its band is owed its floor share (it would only start
  over, again and again).
- **An app holds no channel while another app of the same band holds several**
  (`borrowed`): an app may use every channel while it is alone, but a channel beyond its
  first is borrowed, and the latest started borrowed job gives its channel back when
  another app's job of its band waits. So a tiny inference never queues behind two long
  operations of one app. The trade-off: the stopped job starts over from the beginning
  later (its work so far is lost), which happens only while two apps of one band want
  more channels than there are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from npumanager.vendor_drivers.realexec.work import Work

BandOf = Callable[[int], int]


def by_band(
    running: Sequence[Work], job: Work, band_of: BandOf, owed: Callable[[int], bool]
) -> Work | None:
    """The job to stop for `job`, of a more important band, or None."""
    mine = band_of(job.effective_priority)
    victims = [
        w
        for w in running
        if band_of(w.effective_priority) > mine and not owed(band_of(w.effective_priority))
    ]
    if not victims:
        return None
    return max(victims, key=lambda w: (band_of(w.effective_priority), w.run_start_us))


def borrowed(running: Sequence[Work], job: Work, band_of: BandOf) -> Work | None:
    """The borrowed job to stop for `job`, whose app holds no channel, or None."""
    held = Counter(w.uid for w in running)
    if held[job.uid]:
        return None
    band = band_of(job.effective_priority)
    victims = [w for w in running if held[w.uid] > 1 and band_of(w.effective_priority) == band]
    if not victims:
        return None
    return max(victims, key=lambda w: (held[w.uid], w.run_start_us))
