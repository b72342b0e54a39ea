"""Which DELETING locations count as stranded: by the time their record turned DELETING."""

from chalicelib.capacity.stranded import stranded_locations
from chalicelib.index import Status

from .records import record


def test_only_deleting_locations_of_records_turned_deleting_long_enough_ago():
    records = [
        (1, record([(Status.DELETING, 2, 1, 11)], atime=100)),  # turned DELETING at 100
        (2, record([(Status.DELETING, 1, 0, 12)], atime=101)),  # too recent
        (3, record([(Status.SERVING, 1, 0, 13)], atime=50)),  # served: not a deletion
        (4, record([(Status.WRITING, 1, 0, 14), (Status.DELETING, 3, 0, 15)], atime=0)),
    ]
    assert stranded_locations(records, deleting_since_s=100) == [(1, 11), (4, 15)]
