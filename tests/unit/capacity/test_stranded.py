"""Which DELETING locations count as stranded: by the time their record turned DELETING."""
from chalicelib.capacity.stranded import stranded_victims
from chalicelib.index import Status

from .records import record


def test_only_deleting_locations_of_records_turned_deleting_long_enough_ago():
    records = [
        (1, record([(Status.DELETING, 2, 1, 11)], atime=100)),  # turned DELETING at 100
        (2, record([(Status.DELETING, 1, 0, 12)], atime=101)),  # too recent
        (3, record([(Status.SERVING, 1, 0, 13)], atime=50)),  # served: not a deletion
        (4, record([(Status.WRITING, 1, 0, 14), (Status.DELETING, 3, 0, 15)], atime=0)),
    ]
    victims = stranded_victims(records, deleting_since_s=100)
    assert [(v.block_key, v.location_id, v.storage_index, v.spec_group) for v in victims] == [
        (1, 11, 2, 1), (4, 15, 3, 0)]
