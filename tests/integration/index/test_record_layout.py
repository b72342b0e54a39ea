"""Python and the index scripts read one layout: a record Python encodes is decoded by Lua
through the generated constants, what Lua packs is decoded by Python, and every script
compiles with the constants in front (Lua allows 200 locals per chunk)."""

import pytest

from chalicelib.index.errors import QuotaExceededError
from chalicelib.index.layout import (
    ADOPTER,
    HEADER,
    LOCATION,
    SESSION_ENTRY,
    VICTIM,
    ClaimOutcome,
    FinishStatus,
    RecordFlag,
    StartRefusal,
    Status,
    lua_constants,
)
from chalicelib.index.records import decode_record, decode_victims
from chalicelib.index.scripts import LUA_DIR
from chalicelib.index.scripts import load_script as _load
from chalicelib.index.types import StartRequest

PARENT = (-7).to_bytes(8, "big", signed=True)
HEADER_VALUES = (RecordFlag.HAS_PARENT | RecordFlag.ADOPTED, PARENT, 513, 1_700_000_123, 9, 2**47 + 5, 2)
FIRST = (Status.DELETING, 4, 2, 2**40 - 3, 2**48 - 5, 65534)
SECOND = (Status.SERVING, 200, 1, 77, 123_456, 3)
ADOPTER_SEQUENCE = 2**39 + 1


def _script(valkey, body: str):
    return valkey.register_script(lua_constants() + (LUA_DIR / "prelude.lua").read_text() + "\n" + body)


def test_lua_reads_a_record_python_encodes(valkey):
    rec = HEADER.pack(*HEADER_VALUES) + LOCATION.pack(*FIRST) + LOCATION.pack(*SECOND) + ADOPTER.pack(ADOPTER_SEQUENCE)
    fields = _script(
        valkey,
        """
local rec = ARGV[1]
local out = {}
for _, f in ipairs({{H_FLAGS, H_FLAGS_FMT}, {H_PARENT, H_PARENT_FMT}, {H_CHILDREN, H_CHILDREN_FMT},
                    {H_LAST_ACCESS_S, H_LAST_ACCESS_S_FMT}, {H_LFU, H_LFU_FMT}, {H_WRITE_TIME_MS, H_WRITE_TIME_MS_FMT},
                    {H_LOCATION_COUNT, H_LOCATION_COUNT_FMT}}) do
  out[#out + 1] = struct.unpack(f[2], rec, f[1])
end
for i = 1, location_count(rec) do
  for _, f in ipairs({{L_STATUS, L_STATUS_FMT}, {L_STORAGE_INDEX, L_STORAGE_INDEX_FMT},
                      {L_SPEC_GROUP, L_SPEC_GROUP_FMT}, {L_LOCATION_ID, L_LOCATION_ID_FMT},
                      {L_GROUP_ID, L_GROUP_ID_FMT}, {L_SLOT, L_SLOT_FMT}}) do
    out[#out + 1] = struct.unpack(f[2], rec, loc_pos(i) + f[1])
  end
  local whole = {loc_at(rec, i)}
  for j = 1, 6 do out[#out + 1] = whole[j] end
end
local flags = byte(rec, H_FLAGS)
local named = {has_flag(flags, HAS_PARENT), has_flag(flags, ADOPTED), has_flag(flags, UNLINKED),
               loc_status(rec, 1) == DELETING, find_status(rec, SERVING) == 2, find_loc(rec, 77) == 2}
for _, v in ipairs(named) do out[#out + 1] = v and 1 or 0 end
out[#out + 1] = sequence(rec)
out[#out + 1] = adopter(rec)
return out
""",
    )(args=[rec])
    assert fields == [
        *HEADER_VALUES[:1],
        PARENT,
        *HEADER_VALUES[2:],
        *FIRST,
        *FIRST,
        *SECOND,
        *SECOND,
        1,
        1,
        0,
        1,
        1,
        1,
        FIRST[3],
        ADOPTER_SEQUENCE,
    ]
    parsed = decode_record(rec)
    assert (parsed.parent, parsed.children, parsed.write_time_ms) == (-7, 513, 2**47 + 5)
    assert [(loc.status, loc.location_id, loc.group_id) for loc in parsed.locations] == [
        (Status.DELETING, 2**40 - 3, 2**48 - 5),
        (Status.SERVING, 77, 123_456),
    ]


def test_python_reads_what_lua_packs(valkey):
    victim, entry, record = _script(
        valkey,
        """
local key = ARGV[1]
return {struct.pack(VICTIM_FMT, key, 2^40 - 3, 4, 2, 2^48 - 5, 65534), struct.pack(SESSION_ENTRY_FMT, key, 2^39 + 1),
        struct.pack(HDR_FMT, HAS_PARENT, key, 3, 1700000123, LFU_INITIAL, 2^47 + 5, 1)
          .. struct.pack(LOC_FMT, WRITING, 9, 1, 5, 6, 7)}
""",
    )(args=[PARENT])
    assert [
        (v.block_key, v.location_id, v.storage_index, v.spec_group, v.group_id, v.slot) for v in decode_victims(victim)
    ] == [(-7, 2**40 - 3, 4, 2, 2**48 - 5, 65534)]
    assert len(victim) == VICTIM.size and SESSION_ENTRY.unpack_from(entry) == (PARENT, 2**39 + 1)
    parsed = decode_record(record)
    assert (parsed.parent, parsed.children, parsed.lfu, parsed.write_time_ms) == (-7, 3, 5, 2**47 + 5)
    assert [(loc.status, loc.storage_index, loc.location_id, loc.slot) for loc in parsed.locations] == [
        (Status.WRITING, 9, 5, 7)
    ]


def test_lua_returns_the_python_codes(valkey):
    codes = _script(
        valkey,
        """
return {WRITING, SERVING, DELETING, HAS_PARENT, ADOPTED, UNLINKED, MARKED, FINISH_FINISHED, FINISH_UNKNOWN,
        FINISH_EXPIRED, FINISH_CHANGED, FINISH_GUARDED, REFUSED_GONE, REFUSED_INSTANCE, REFUSED_SESSIONS,
        CLAIM_OK, CLAIM_OCCUPIED}
""",
    )()
    assert codes == [
        *Status,
        *RecordFlag,
        *FinishStatus,
        StartRefusal.GONE.value.encode(),
        StartRefusal.INSTANCE.value.encode(),
        StartRefusal.SESSIONS.value.encode(),
        ClaimOutcome.OK.value.encode(),
        ClaimOutcome.OCCUPIED.value.encode(),
    ]


@pytest.mark.parametrize("name", sorted(p.stem for p in LUA_DIR.glob("*.lua") if p.stem != "prelude"))
def test_every_script_compiles_with_the_constants(valkey, name):
    assert len(valkey.script_load(_load(name))) == 40


def test_a_refusal_code_reaches_python(index, layout):
    request = StartRequest("s1", 10**13, "s", "file", 0, [100], [0], max_sessions=1)
    index.start(layout, [1], request)
    with pytest.raises(QuotaExceededError) as refused:
        index.start(layout, [2], StartRequest("s2", 10**13, "s", "file", 0, [100], [0], max_sessions=1))
    assert refused.value.kind == StartRefusal.SESSIONS.value
