#!/usr/bin/env bash
# Leader election with pg_fence from the shell, step by step: a campaign, a proclaim, an observer
# that sees every change of leader (vacancy included), a hand-off to a waiting candidate, why the
# old lease ended, a resignation, and a lock-delay. Run it against a database where pg_fence is
# installed, as a role with fence_user (fence_admin is not needed):
#
#   PGHOST=127.0.0.1 PGPORT=5432 PGUSER=app PGDATABASE=app docs/examples/leader_election.sh
#
# Each step is one statement in its own transaction, as a client library makes it. tests/tests/election.rs
# runs this script and checks what it prints.
set -euo pipefail
KEY=${KEY:-example-leader}
sql() { psql -X -qAt -v ON_ERROR_STOP=1 -v key="$KEY" "$@"; }

# The observer: await_change with the state it saw last returns the next state, or the same one
# after its timeout. It stops after 5 quiet seconds.
observe() {
    local fence="" owner="" row
    while row=$(sql -v fence="$fence" -v owner="$owner" <<'SQL'
SELECT coalesce(fence::text, '') || '|' || coalesce(owner, '')
  FROM fence.await_change(:'key', nullif(:'fence', '')::bigint, nullif(:'owner', ''), '5 seconds');
SQL
    ); do
        if [ "$row" = "$fence|$owner" ]; then
            return
        fi
        fence=${row%%|*} owner=${row#*|}
        echo "observer: leader is ${owner:-nobody} (fence ${fence:-none})"
    done
}
observe &
observer=$!
sleep 0.5

# v1 campaigns and wins; it advertises its address.
read -r v1_fence v1_token < <(sql -F ' ' -c "SELECT fence, token FROM fence.lease_acquire('$KEY', '30 seconds', 'v1')")
echo "v1: leading with fence $v1_fence"
sql -c "SELECT fence.lease_proclaim('$KEY', '$v1_token', 'v1 at 10.0.0.1')" >/dev/null

# v2, the new version of the service, campaigns and waits.
sql -F ' ' -c "SELECT fence, token FROM fence.lease_acquire('$KEY', '30 seconds', 'v2', wait => '20 seconds')" >"${TMPDIR:-/tmp}/v2.$$" &
candidate=$!
until [ "$(sql -c "SELECT fence.waiters('$KEY')")" = 1 ]; do sleep 0.1; done

# v1 hands the lease to v2, ahead of anyone else waiting.
echo "v1: handed off to $(sql -c "SELECT owner || ' with fence ' || fence FROM fence.lease_handoff('$KEY', '$v1_token', 'v2')")"
wait "$candidate"
read -r v2_fence v2_token <"${TMPDIR:-/tmp}/v2.$$"
rm -f "${TMPDIR:-/tmp}/v2.$$"
echo "v2: leading with fence $v2_fence"

# v1's lease is over, and it can tell why; a renewal with its token fails with PF001.
echo "v1: my lease $(sql -c "SELECT state || ', ' || reason FROM fence.lease_status('$KEY', '$v1_token')")"
sql -c "SELECT fence.lease_renew('$KEY', '$v1_token', '30 seconds')" 2>/dev/null || echo "v1: renewal refused"

# v2 resigns: the observer sees the vacancy.
sql -c "SELECT fence.lease_release('$KEY', '$v2_token')" >/dev/null
echo "v2: resigned"
sleep 0.5

# A lock-delay: v3's lease expires (a crash, say); nobody leads for 2 seconds after that.
read -r v3_expiry < <(sql -c "SELECT extract(epoch FROM expires_at) FROM fence.lease_acquire('$KEY', '1 second', 'v3', lock_delay => '2 seconds')")
echo "v3: leading, then stops renewing"
after=$(sql -c "SELECT round((extract(epoch FROM acquired_at) - $v3_expiry)::numeric, 1)
                FROM fence.lease_acquire('$KEY', '1 second', 'v4', wait => '10 seconds')")
echo "v4: leading, $after s after v3's lease expired"
wait "$observer"
