//! The Lua scripts: every step that must be atomic on the server (taking,
//! extending and releasing a lease, the leader's fenced write, a replace
//! or invalidation that revokes a load in flight, tag generations), each
//! with its keys and arguments documented above it.
//!
//! A script runs with `EVALSHA`, and with `EVAL` (which also caches it on
//! that node) when the node does not know it yet ([`run_script`]).

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, Script, ToRedisArgs};

// A lease's value is its holder's token followed by one status byte: `-`,
// or `w` once someone else has tried to take it (a waiter). The holder is
// the value without its last byte, so tokens of any length compare exactly.

/// Lua that keeps the lease index (see `index`): `listed(idx, lease)`,
/// whether the index names the lease (an index of another Redis type names
/// none); `enlist(idx, lease)` adds it (an index of another type is
/// replaced: it named no lease); `unlist(idx, lease)` takes it off;
/// `outlive(idx, ttl)` makes the index's TTL at least `ttl` ms, never
/// shorter; `sweep(idx)` takes up to two members whose lease key is gone
/// off it.
const INDEX_LUA: &str = r"
local function listed(idx, lease)
  return redis.pcall('SISMEMBER', idx, lease) == 1
end
local function enlist(idx, lease)
  local added = redis.pcall('SADD', idx, lease)
  if type(added) == 'table' and added.err then
    redis.call('DEL', idx)
    redis.call('SADD', idx, lease)
  end
end
local function unlist(idx, lease)
  redis.pcall('SREM', idx, lease)
end
local function outlive(idx, ttl)
  local left = redis.call('PTTL', idx)
  if left == -1 or (left >= 0 and left < tonumber(ttl)) then
    redis.call('PEXPIRE', idx, ttl)
  end
end
local function sweep(idx)
  local some = redis.pcall('SRANDMEMBER', idx, 2)
  if type(some) == 'table' and not some.err then
    for _, lease in ipairs(some) do
      if redis.call('EXISTS', lease) == 0 then
        redis.call('SREM', idx, lease)
      end
    end
  end
end
";

/// A script that uses [`INDEX_LUA`]'s functions.
fn indexed(body: &str) -> Lua {
    Lua::new(&format!("{INDEX_LUA}{body}"))
}

/// `KEYS[1]` the lease index; for each lease `KEYS[1 + i]` (`ARGV[1]` the
/// TTL in ms, `ARGV[1 + i]` the token): `SET NX PX` the lease, `-1` if
/// taken, or already held by this token (a retried call whose first run's
/// reply was lost: idempotent; the load starts after this reply, so it is
/// taken again even if revoked meanwhile), or held in this format (a token
/// as long as ours plus a status byte) but not named by the index
/// (revoked, its index lost, or an earlier build's: free to take).
/// A taken lease is added to the index, which then lives at least `ttl`.
/// If someone else holds it, mark it waited on (`SETRANGE` keeps its TTL)
/// — only a value in this format, so a lease written by a much earlier
/// build, a bare token, is never altered — and reply its remaining TTL in ms (a lease without one, never
/// written by breakwater, counts as a full `ttl`, so waiters do not spin on
/// it). A value of another Redis type under the lease key is no lease: it
/// is replaced by this one. One reply per key, in order; then two of the
/// index's members are swept.
pub(super) static ACQUIRE_LEASES: LazyLock<Lua> = LazyLock::new(|| {
    indexed(
        r"local idx = KEYS[1]
          local ttl = ARGV[1]
          local out = {}
          local took = false
          for i = 2, #KEYS do
            local key = KEYS[i]
            local token = ARGV[i]
            local left = -1
            if not redis.call('SET', key, token .. '-', 'NX', 'PX', ttl) then
              local held = redis.pcall('GET', key)
              if type(held) == 'table' and held.err then
                redis.call('SET', key, token .. '-', 'PX', ttl)
              elseif held and string.sub(held, 1, -2) == token then
                left = -1
              elseif held and #held == #token + 1 and not listed(idx, key) then
                redis.call('SET', key, token .. '-', 'PX', ttl)
              else
                if held and #held == #token + 1 then
                  local mark = string.sub(held, -1)
                  if mark == '-' or mark == 'w' then
                    redis.call('SETRANGE', key, #held - 1, 'w')
                  end
                end
                left = redis.call('PTTL', key)
                if left < 0 then
                  left = tonumber(ttl)
                end
              end
            end
            if left == -1 then
              enlist(idx, key)
              took = true
            end
            out[i - 1] = left
          end
          if took then
            outlive(idx, ttl)
          end
          sweep(idx)
          return out",
    )
});

/// KEYS = lease, lease index; ARGV = token, ttl ms. `PEXPIRE` the lease
/// (and the index, not shorter) only while `ARGV[1]` holds it and the
/// index names it.
pub(super) static EXTEND_LEASE: LazyLock<Lua> = LazyLock::new(|| {
    indexed(
        r"local held = redis.call('GET', KEYS[1])
          if held and string.sub(held, 1, -2) == ARGV[1] and listed(KEYS[2], KEYS[1]) then
            outlive(KEYS[2], ARGV[2])
            return redis.call('PEXPIRE', KEYS[1], ARGV[2])
          end
          return 0",
    )
});

/// KEYS = lease, lease index; ARGV = token, channel, message. Delete the
/// lease (and take it off the index) only if `ARGV[1]` holds it, then
/// publish.
pub(super) static RELEASE_LEASE: LazyLock<Lua> = LazyLock::new(|| {
    indexed(
        r"local held = redis.call('GET', KEYS[1])
          if held and string.sub(held, 1, -2) == ARGV[1] then
            redis.call('DEL', KEYS[1])
            unlist(KEYS[2], KEYS[1])
            redis.call('PUBLISH', ARGV[2], ARGV[3])
            return 1
          end
          return 0",
    )
});

/// KEYS = lease, lease index: 1 if the lease key exists and the index
/// names it, else 0.
pub(super) static LEASE_HELD: LazyLock<Lua> = LazyLock::new(|| {
    indexed(
        r"if redis.call('EXISTS', KEYS[1]) == 1 and listed(KEYS[2], KEYS[1]) then
            return 1
          end
          return 0",
    )
});

/// The leader's write: KEYS = value, lease, lease index (and, with a
/// condition, the key that must be unchanged); ARGV = token, value, ttl
/// ms, channel, message, value message (empty for none) (and the bytes the
/// fourth key must hold). Writes only while the token holds the lease and
/// the index names it. A lease the token holds that the index does not
/// name (a bulk write revoked it, or the index was lost) is released and
/// the message published, as for a write that failed, so its waiters take
/// over; likewise if the fourth key does not hold exactly those bytes. A
/// waited-on lease with a value message publishes that message with the
/// value appended. `SET` replaces a value of any Redis type (a list
/// someone pushed under the key is repaired here). If the server refuses
/// the write (an error about this key), the lease is still released and
/// waiters told, so they do not wait out its TTL, and the error is
/// returned. The lease leaves the index whenever it is deleted.
pub(super) static FENCED_SET: LazyLock<Lua> = LazyLock::new(|| {
    indexed(
        r"local held = redis.call('GET', KEYS[2])
          if held and string.sub(held, 1, -2) == ARGV[1] then
            local function release()
              redis.call('DEL', KEYS[2])
              unlist(KEYS[3], KEYS[2])
            end
            if not listed(KEYS[3], KEYS[2])
                or (KEYS[4] and redis.call('GET', KEYS[4]) ~= ARGV[7]) then
              release()
              redis.call('PUBLISH', ARGV[4], ARGV[5])
              return 0
            end
            local written = redis.pcall('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
            if type(written) == 'table' and written.err then
              release()
              redis.call('PUBLISH', ARGV[4], ARGV[5])
              return written
            end
            release()
            if string.sub(held, -1) == 'w' and ARGV[6] ~= '' then
              redis.call('PUBLISH', ARGV[4], ARGV[6] .. ARGV[2])
            else
              redis.call('PUBLISH', ARGV[4], ARGV[5])
            end
            return 1
          end
          return 0",
    )
});

/// A soft invalidation: KEYS = value, lease; ARGV = the time it is stale
/// from (8 bytes, big-endian store-clock ms), channel, message. Deletes the
/// lease; if the value is an entry (magic `BW`, format version 1 or 2)
/// lowers its `fresh_until` (bytes 5..13) to that time, but not past its
/// `stale_until` (bytes 13..21), byte by byte (`<` on Lua strings follows
/// the locale), or, not above it already, by 1 ms (the bytes always
/// change: a version transition pinned beside them hears it); publishes;
/// 1 if there was an entry.
pub(super) static EXPIRE_ENTRY: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local function below(a, b)
            for i = 1, 8 do
              local x, y = string.byte(a, i), string.byte(b, i)
              if x ~= y then
                return x < y
              end
            end
            return false
          end
          redis.call('DEL', KEYS[2])
          local head = redis.pcall('GETRANGE', KEYS[1], 0, 20)
          local found = 0
          if type(head) == 'string' and #head == 21 and string.sub(head, 1, 2) == 'BW'
              and (string.byte(head, 3) == 1 or string.byte(head, 3) == 2) then
            found = 1
            local fresh = string.sub(head, 6, 13)
            local stale = string.sub(head, 14, 21)
            local at = ARGV[1]
            if below(stale, at) then
              at = stale
            end
            if below(at, fresh) then
              redis.call('SETRANGE', KEYS[1], 5, at)
            else
              local bytes = {string.byte(fresh, 1, 8)}
              local i = 8
              while i >= 1 and bytes[i] == 0 do
                bytes[i] = 255
                i = i - 1
              end
              if i >= 1 then
                bytes[i] = bytes[i] - 1
                redis.call('SETRANGE', KEYS[1], 5, string.char(unpack(bytes)))
              end
            end
          end
          redis.call('PUBLISH', ARGV[2], ARGV[3])
          return found",
    )
});

/// The holder's renewal of an unchanged entry: KEYS = value, lease, lease
/// index; ARGV = token, offset, expected bytes, patch, ttl ms, channel,
/// message. Only while the token holds the lease and the index names it:
/// if the value holds the expected bytes at the offset, `SETRANGE` the
/// patch there, `PEXPIRE` it, delete the lease (off the index too),
/// publish and return 1; if not (gone, rewritten, another Redis type),
/// change nothing, keep the lease and return 2. A lease the token holds
/// that the index does not name is released and the message published (its
/// waiters take over), and 0 returned; a lease not held: 0.
pub(super) static RENEW: LazyLock<Lua> = LazyLock::new(|| {
    indexed(
        r"local held = redis.call('GET', KEYS[2])
          if not (held and string.sub(held, 1, -2) == ARGV[1]) then
            return 0
          end
          if not listed(KEYS[3], KEYS[2]) then
            redis.call('DEL', KEYS[2])
            redis.call('PUBLISH', ARGV[6], ARGV[7])
            return 0
          end
          local at = tonumber(ARGV[2])
          local seen = redis.pcall('GETRANGE', KEYS[1], at, at + #ARGV[3] - 1)
          if type(seen) ~= 'string' or seen ~= ARGV[3] then
            return 2
          end
          redis.call('SETRANGE', KEYS[1], at, ARGV[4])
          redis.call('PEXPIRE', KEYS[1], ARGV[5])
          redis.call('DEL', KEYS[2])
          unlist(KEYS[3], KEYS[2])
          redis.call('PUBLISH', ARGV[6], ARGV[7])
          return 1",
    )
});

/// What `KEYS[1]` holds, or `ARGV[1]` (the placeholder), written there with
/// `PX` `ARGV[2]` if it holds nothing.
pub(super) static PIN: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local held = redis.call('GET', KEYS[1])
          if held then
            return held
          end
          redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
          return ARGV[1]",
    )
});

/// A plain write that revokes any load in flight: KEYS = value, lease; ARGV
/// = value, ttl ms, channel, message.
pub(super) static REPLACE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"redis.call('DEL', KEYS[2])
          redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
          redis.call('PUBLISH', ARGV[3], ARGV[4])
          return 1",
    )
});

/// Delete value and lease together, then publish.
pub(super) static INVALIDATE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"redis.call('DEL', KEYS[1], KEYS[2])
          redis.call('PUBLISH', ARGV[1], ARGV[2])
          return 1",
    )
});

/// What a tag counter holds, in Lua (the format of `TagState`):
/// `state(key)` is its generation, floor, last soft bump's ms and last
/// hard change's ms (`G, G, 0, 0` for plain digits `G`; `G, H, T, 0` for
/// `G:H:T`; `G, H, T, F` for `G:H:T:F`; with `H <= G`), each part
/// 1 to 16 decimal digits below 2^53 (Lua numbers are doubles, exact up
/// to there), else `nil` (missing, foreign, or a value of another Redis
/// type: `GET` fails, which `pcall` catches). `generation(key)` is its
/// `G` alone. `at_least(key, ttl)` makes its TTL at least `ttl` ms
/// (`PTTL` is -1 for a key without one, so it gets one); never shortens
/// it. `moved_on(key, new, ttl)` writes `new` there with its TTL kept if
/// longer than `ttl` (`SET` drops it, so it is read first).
macro_rules! generation_lua {
    ($body:literal) => {
        concat!(
            r"local function digits(s)
                if s and #s >= 1 and #s <= 16 and string.match(s, '^%d+$') then
                  local n = tonumber(s)
                  if n < 9007199254740992 then
                    return n
                  end
                end
                return nil
              end
              local function state(key)
                local held = redis.pcall('GET', key)
                if type(held) ~= 'string' then
                  return nil
                end
                local g = digits(held)
                if g then
                  return g, g, 0, 0
                end
                local a, b, c, d = string.match(held, '^(%d+):(%d+):(%d+):(%d+)$')
                if not a then
                  a, b, c = string.match(held, '^(%d+):(%d+):(%d+)$')
                  d = '0'
                end
                local h, t, f
                g, h, t, f = digits(a), digits(b), digits(c), digits(d)
                if g and h and t and f and h <= g then
                  return g, h, t, f
                end
                return nil
              end
              local function generation(key)
                local g = state(key)
                return g
              end
              local function at_least(key, ttl)
                if redis.call('PTTL', key) < ttl then
                  redis.call('PEXPIRE', key, ttl)
                end
              end
              local function moved_on(key, new, ttl)
                local left = redis.call('PTTL', key)
                redis.call('SET', key, new, 'PX', string.format('%.0f', math.max(left, ttl)))
              end
              ",
            $body
        )
    };
}

/// A tag's generation bump: KEYS = the counter; ARGV = channel, message,
/// fresh value, TTL in ms. A counter holding a generation (either form)
/// goes up by one, as plain digits (the floor moves up with it); a missing
/// or foreign one is set to the fresh value (`SET` replaces any Redis
/// type). Its TTL is kept if longer than `ARGV[4]`. Then publishes;
/// returns the new generation as digits.
pub(super) static BUMP_GENERATION: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(generation_lua!(
        r"local old = generation(KEYS[1])
          local new = ARGV[3]
          if old then
            new = string.format('%.0f', old + 1)
          end
          moved_on(KEYS[1], new, tonumber(ARGV[4]))
          redis.call('PUBLISH', ARGV[1], ARGV[2])
          return new"
    ))
});

/// Several tags' generation bumps (`Store::bump_generations`): KEYS = the
/// counters (of one hash slot); ARGV = channel, message, fresh value, TTL
/// in ms. Each counter moves on as in [`BUMP_GENERATION`]; then one
/// publish. One reply (the new generation, digits) per key, in order.
pub(super) static BUMP_GENERATIONS: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(generation_lua!(
        r"local out = {}
          for i, key in ipairs(KEYS) do
            local old = generation(key)
            local new = ARGV[3]
            if old then
              new = string.format('%.0f', old + 1)
            end
            moved_on(key, new, tonumber(ARGV[4]))
            out[i] = new
          end
          redis.call('PUBLISH', ARGV[1], ARGV[2])
          return out"
    ))
});

/// A tag's soft bump: KEYS = the counter; ARGV = channel, message, fresh
/// value, TTL in ms, the bump's store-clock ms (digits). A counter holding
/// `G` or `G:H:T` comes to hold `G+1:H:<ms>` (plain `G` has the floor
/// `G`), one holding `G:H:T:F` `G+1:H:<ms>:F` (a soft bump is no hard
/// change); a missing or foreign one is set to the fresh value. Its TTL is
/// kept if longer than `ARGV[4]`. Then publishes; returns the new
/// generation as digits.
pub(super) static EXPIRE_GENERATION: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(generation_lua!(
        r"local g, h, _, f = state(KEYS[1])
          local new, out = ARGV[3], ARGV[3]
          if g then
            out = string.format('%.0f', g + 1)
            new = out .. ':' .. string.format('%.0f', h) .. ':' .. ARGV[5]
            if f > 0 then
              new = new .. ':' .. string.format('%.0f', f)
            end
          end
          moved_on(KEYS[1], new, tonumber(ARGV[4]))
          redis.call('PUBLISH', ARGV[1], ARGV[2])
          return out"
    ))
});

/// Read-or-create of tag counters: KEYS = the counters; ARGV = fresh
/// value, TTL in ms. Each counter holding a generation is replied as it
/// is; a missing or foreign one is set to the fresh value first. Each
/// one's TTL is made at least `ARGV[2]`. One reply (digits) per key, in
/// order.
pub(super) static TAG_GENERATIONS: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(generation_lua!(
        r"local fresh, ttl = ARGV[1], tonumber(ARGV[2])
          local out = {}
          for i, key in ipairs(KEYS) do
            local held = generation(key)
            if held then
              at_least(key, ttl)
              out[i] = string.format('%.0f', held)
            else
              redis.call('SET', key, fresh, 'PX', ARGV[2])
              out[i] = fresh
            end
          end
          return out"
    ))
});

/// Read-or-create of tag counters with the time of their last hard change
/// (`Store::tag_states`): KEYS = the counters; ARGV = fresh value, TTL in
/// ms, the caller's view of the store clock's now in ms (digits, at least
/// 1). "Now" is the later of that and the server's `TIME` when the script
/// runs (a script sent earlier and run late, after a reconnect or a
/// timeout, must not date a change before it). A counter holding
/// a state keeps it, with `F` set to now if unknown (0); a missing or
/// foreign one is set to `fresh:fresh:0:now`. Each one's TTL is made at
/// least `ARGV[2]`. One reply per key, in order: its state, `G:H:T:F`.
pub(super) static TAG_STATES: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(generation_lua!(
        r"local fresh, ttl = ARGV[1], tonumber(ARGV[2])
          local clock = redis.call('TIME')
          local ran = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
          local now = string.format('%.0f', math.max(tonumber(ARGV[3]), ran))
          local out = {}
          for i, key in ipairs(KEYS) do
            local g, h, t, f = state(key)
            if g then
              local held = string.format('%.0f:%.0f:%.0f:', g, h, t)
              if f > 0 then
                out[i] = held .. string.format('%.0f', f)
                at_least(key, ttl)
              else
                out[i] = held .. now
                moved_on(key, out[i], ttl)
              end
            else
              out[i] = fresh .. ':' .. fresh .. ':0:' .. now
              redis.call('SET', key, out[i], 'PX', ARGV[2])
            end
          end
          return out"
    ))
});

/// The startup check's permission probe: KEYS = a string key and a set
/// key the cache's user may write (in one hash slot), ARGV = the
/// namespace's channel. Runs every command the store's scripts run on
/// them (and `PUBLISH` of an empty message, which receivers ignore), then
/// deletes both; returns the names of those refused for want of a
/// permission (`NOPERM`, or Redis 7.0's "can't run this command" inside
/// a script).
pub(super) static CHECK_PERMISSIONS: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local refused = {}
          local function try(...)
            local reply = redis.pcall(...)
            if type(reply) == 'table' and reply.err
              and (string.find(reply.err, 'NOPERM') or string.find(reply.err, 'permission')
                or string.find(reply.err, 'run this command', 1, true)) then
              table.insert(refused, (select(1, ...)))
            end
          end
          try('SET', KEYS[1], 'x', 'PX', 10000)
          try('GET', KEYS[1])
          try('GETRANGE', KEYS[1], 0, 0)
          try('SETRANGE', KEYS[1], 0, 'x')
          try('EXISTS', KEYS[1])
          try('PEXPIRE', KEYS[1], 10000)
          try('PTTL', KEYS[1])
          try('SADD', KEYS[2], 'x')
          try('SISMEMBER', KEYS[2], 'x')
          try('SRANDMEMBER', KEYS[2])
          try('SREM', KEYS[2], 'x')
          try('PUBLISH', ARGV[1], '')
          try('TIME')
          try('DEL', KEYS[1])
          try('DEL', KEYS[2])
          return refused",
    )
});

/// One clear of a namespace (see `store::namespace`): KEYS = its clear
/// record; ARGV = channel, message, fresh value, `1` for hard, window ms,
/// the store clock's now in ms, `1` for a pin, the record a pin puts back
/// (empty: none). The record (seven numbers below 2^53 with `H <= N`,
/// `L < N` and `S <= N`, or five read with `S = H`, `E = 0`; anything
/// else counts as none) is advanced as `NamespaceState::applied` advances
/// it (a pin: returned as held; else the record given put back, not
/// published; else an adopting pin made over none), written without a
/// TTL, and published appended to the message. Returns the record and
/// `PUBLISH`'s count (0 for a record a pin kept or put back).
pub(super) static CLEAR_NAMESPACE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local top = 9007199254740992
          local function parse(text)
            if type(text) ~= 'string' then return nil end
            local p = {string.match(text, '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')}
            if #p == 0 then
              p = {string.match(text, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')}
              if #p == 5 then p[6], p[7] = p[2], '0' end
            end
            if #p ~= 7 then return nil end
            for i = 1, 7 do
              if #p[i] > 16 or tonumber(p[i]) >= top then return nil end
              p[i] = tonumber(p[i])
            end
            if p[2] > p[1] or p[5] >= p[1] or p[6] > p[1] then return nil end
            return p
          end
          local fresh = tonumber(ARGV[3])
          local now = tonumber(ARGV[6])
          local held = redis.pcall('GET', KEYS[1])
          local n, h, t, w, l, s, e
          local found = parse(held)
          if found then
            n, h, t, w, l, s, e = found[1], found[2], found[3], found[4], found[5], found[6], found[7]
          end
          local pin = top - 1
          local marked = false
          if n and ARGV[7] == '1' then
            return {held, 0}
          elseif ARGV[7] == '1' then
            if parse(ARGV[8]) then
              redis.call('SET', KEYS[1], ARGV[8])
              return {ARGV[8], 0}
            end
            n, h, t, w, l, s, e = fresh + 1, 0, now, pin, fresh, 0, 0
            local record = string.format('%.0f:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f', n, h, t, w, l, s, e)
            redis.call('SET', KEYS[1], record)
            local receivers = redis.call('PUBLISH', ARGV[1], ARGV[2] .. record)
            return {record, receivers}
          elseif n then
            marked = h < n and w ~= pin
            n = math.min(n + 1, top - 1)
          else
            n, h, t, w, l, s, e = fresh + 1, fresh, 0, 0, fresh, fresh, 0
          end
          local ends = t + w
          if ARGV[4] == '1' then
            h, s, e = n, n, 0
          elseif marked and ends > now then
            w = math.min(w, math.max(now + tonumber(ARGV[5]) - t, 0))
          else
            if marked then
              s, e = n - 1, ends
            end
            t, w = now, tonumber(ARGV[5])
          end
          local record = string.format('%.0f:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f', n, h, t, w, l, s, e)
          redis.call('SET', KEYS[1], record)
          local receivers = redis.call('PUBLISH', ARGV[1], ARGV[2] .. record)
          return {record, receivers}",
    )
});

/// A namespace clear a failover may have lost, applied again on the new
/// master: KEYS = the clear record; ARGV = channel, message, the record
/// the clear wrote (`N:H:T:W:L:S:E`). If the key holds no record (or
/// foreign bytes), that record is put back. If it holds one that contains
/// it (the same history, `L` equal, with `N` and `H` at least as high),
/// nothing changes. Otherwise the two histories cannot be merged exactly,
/// and the stricter answer is taken: a hard clear over what is held (`N`
/// one past the higher of the two, when they share a history). The record
/// written is published after the message; 0 if nothing changed. Replays
/// from several processes, in any order, end with every lost clear
/// covered.
pub(super) static RESTORE_RECORD: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local top = 9007199254740992
          local function parse(text)
            if type(text) ~= 'string' then return nil end
            local p = {string.match(text, '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')}
            if #p == 0 then
              p = {string.match(text, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')}
              if #p == 5 then p[6], p[7] = p[2], '0' end
            end
            if #p ~= 7 then return nil end
            for i = 1, 7 do
              if #p[i] > 16 or tonumber(p[i]) >= top then return nil end
              p[i] = tonumber(p[i])
            end
            if p[2] > p[1] or p[5] >= p[1] or p[6] > p[1] then return nil end
            return p
          end
          local mine = parse(ARGV[3])
          if not mine then return 0 end
          local held = parse(redis.pcall('GET', KEYS[1]))
          local record
          if not held then
            record = ARGV[3]
          elseif held[5] == mine[5] and held[1] >= mine[1] and held[2] >= mine[2] then
            return 0
          else
            local n = held[1]
            if held[5] == mine[5] then n = math.max(n, mine[1]) end
            n = math.min(n + 1, top - 1)
            record = string.format('%.0f:%.0f:%.0f:%.0f:%.0f:%.0f:%.0f',
              n, n, held[3], held[4], held[5], n, 0)
          end
          redis.call('SET', KEYS[1], record)
          redis.call('PUBLISH', ARGV[1], ARGV[2] .. record)
          return 1",
    )
});

/// A Lua script, run with `EVALSHA`, and with `EVAL` (which also caches it
/// on that node) when the node does not know it yet. Not with
/// `SCRIPT LOAD`: redis-rs sends that to every node of a cluster, and one
/// hung node then makes every lease on a node that lost its scripts time
/// out.
pub(super) struct Lua {
    code: String,
    sha: String,
}

impl Lua {
    fn new(code: &str) -> Self {
        let sha = Script::new(code).get_hash().to_owned();
        Lua {
            code: code.to_owned(),
            sha,
        }
    }

    pub(super) fn key(&self, key: impl ToRedisArgs) -> Invocation<'_> {
        Invocation {
            lua: self,
            keys: key.to_redis_args(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`Lua`] script: its keys and arguments.
pub(super) struct Invocation<'a> {
    lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    pub(super) fn key(mut self, key: impl ToRedisArgs) -> Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub(super) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// Its first key: the others share its hash slot, and so its failure
    /// domain.
    pub(super) fn first_key(&self) -> Option<&[u8]> {
        self.keys.first().map(Vec::as_slice)
    }

    /// `EVALSHA <sha> …`, or `EVAL <code> …` when `with_code`.
    pub(super) fn cmd(&self, with_code: bool) -> Cmd {
        let (verb, script) = if with_code {
            ("EVAL", self.lua.code.as_str())
        } else {
            ("EVALSHA", self.lua.sha.as_str())
        };
        let mut cmd = redis::cmd(verb);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }
}

/// `EVALSHA`, then `EVAL` if the node does not have the script.
pub(super) async fn run_script<T: FromRedisValue>(
    conn: &mut impl ConnectionLike,
    script: &Invocation<'_>,
) -> redis::RedisResult<T> {
    match script.cmd(false).query_async(conn).await {
        Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.cmd(true).query_async(conn).await
        }
        other => other,
    }
}
