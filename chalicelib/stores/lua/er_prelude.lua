-- Shared by the event-report scripts (reporters.py), prepended at load time.
--
-- Reported locations of an instance live in one hash (KEYS of the callers):
--   field = block key (decimal), value = cmsgpack array of locations
--   {rid, medium, {name, uri, version, name, uri, version, ...}}
-- rid = '<l1p5|l2>#<host_ip_port>' names the reporter; the location id upstream prints is
-- 'kvs#event_report_<type>#<medium>#<host_ip_port>'. ``version`` is the reporter's
-- generation when the spec was written; readers append it to the URI as ``s_version``.
--
-- A reporter's state is a hash: reg ('1' registered, '0' tombstone), med (mediums, ','),
-- hb (last heartbeat, ms), life (lifecycle generation), gen (current generation token),
-- com (committed snapshot token), strict ('1' after a snapshot), snap_at (ms of the last
-- successful snapshot), ret (retired generation tokens, ' '-separated: hidden, cleaned).

local function er_decode(raw)
  if not raw then return {} end
  return cmsgpack.unpack(raw)
end

local function er_store(loc_key, field, locs)
  if #locs == 0 then
    redis.call('HDEL', loc_key, field)
  else
    redis.call('HSET', loc_key, field, cmsgpack.pack(locs))
  end
end

local function er_set(words)
  local set = {}
  for w in string.gmatch(words or '', '%S+') do set[w] = true end
  return set
end

-- How a reader sees one reporter: nil when hidden (tombstone, or no heartbeat for
-- ``timeout_ms``), else {retired set, strict, committed token}.
local function er_view(state, now, timeout_ms)
  if not state or state.reg ~= '1' then return nil end
  if now - tonumber(state.hb or 0) > timeout_ms then return nil end
  return {ret = er_set(state.ret), strict = state.strict == '1', com = state.com or ''}
end

-- The visible spec names of a location under ``view`` (nil when the location is hidden):
-- specs of retired generations are hidden; a strict reporter's location needs one spec of
-- its committed snapshot.
local function er_visible_specs(view, specs)
  local names, committed = {}, false
  for i = 1, #specs, 3 do
    local version = specs[i + 2]
    if not view.ret[version] then
      names[#names + 1] = specs[i]
      if version == view.com then committed = true end
    end
  end
  if #names == 0 or (view.strict and not committed) then return nil end
  return names
end

local function hgetall_table(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then return nil end
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end
