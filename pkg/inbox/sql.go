package inbox

// statements are the SQL the Store runs, built once per Store from its
// names. pgx prepares each on first use per connection and reuses it.
type statements struct {
	// claim inserts a record's inbox row if the lease is still at the
	// member's epoch and the offset is not below the partition's applied
	// mark. Arguments: group, topic, partition, offset, epoch, dedup key
	// digest (nullable bytea). It returns the lease's epoch (NULL when the
	// partition has no lease) and whether the row was inserted. One round
	// trip tells the three outcomes apart: fenced (epoch differs), replay
	// (not inserted: the row or the key exists, or the offset is below the
	// mark), or claimed. It also returns the transaction's id, to learn
	// the outcome of a COMMIT whose answer is lost (see indoubt.go). The insert waits for a concurrent
	// transaction holding the same row (an old owner still running the
	// record) and then reports a replay if that one committed.
	claim string
	// claimBatch is claim for the records of one batch at once. Arguments:
	// group, topic, partition, offsets, dedup key digests (parallel,
	// nullable), epoch. It returns the lease's epoch, the offsets it
	// inserted and the transaction's id.
	claimBatch string
	// claimRedrive is claimBatch for a batch in which some record is a
	// redriven dead letter (see origin.go): it also inserts, for each such
	// record whose own row it inserted, an origin row at the record's
	// origin coordinates, unless the origin partition's applied mark is
	// above the origin offset. Arguments: those of claimBatch, then the
	// origin topics, partitions and offsets (parallel to the offsets; NULL
	// for a record without an origin). It returns what claimBatch does,
	// then the offsets (of the batch's records) whose origin rows it
	// inserted, and those whose origin is below its partition's applied
	// mark with no row left to say whether it was applied.
	claimRedrive string
	// xactStatus is pg_xact_status of a transaction id: committed,
	// aborted, in progress, or NULL when it is too old to know. Argument:
	// the id (pg_current_xact_id, as bigint).
	xactStatus string
	// rows counts the inbox rows of records, to check what pg_xact_status
	// said of their transaction (see verdict). Arguments: group, topics,
	// partitions, offsets (parallel).
	rows string
	// unclaim deletes a record's inbox row, and the origin row it claimed
	// with it if any, when its effect failed inside a batch. Arguments:
	// group, topic, partition, offset, origin topic, partition and offset
	// (NULL for none).
	unclaim string
	// bump takes the leases of an assignment's partitions: one statement,
	// so each lease moves atomically. It waits for old owners'
	// transactions that are committing (the lease lock trigger takes the
	// partition's advisory lock, which their fence holds shared; under
	// REPEATABLE READ they hold the row FOR SHARE), and every old-owner
	// commit after it fails the fence. It locks the rows in the order
	// given. Arguments: group, owner, topics, partitions, member ids
	// (parallel; NULL when unknown). It returns each partition's topic,
	// partition, new epoch and applied mark.
	bump string
	// retake takes a partition's lease back for the member the group
	// coordinator says owns it (see Owners), if the lease is still at the
	// epoch that fenced the member (0: whatever it is). Arguments: group,
	// topic, partition, epoch, owner, member. It returns the new epoch, no
	// row when the lease moved meanwhile.
	retake string
	// applied lists the inbox offsets of an assignment's partitions for
	// replay skip: per partition, up to a limit, those at or above its
	// start offset, or the newest ones for a start below 0 (unknown).
	// Arguments: group, topics, partitions, starts (parallel), limit. It
	// returns the partition's position in the arrays (1-based) and an
	// offset.
	applied string
	// shareLease creates a share group's lease row for a partition if it
	// has none (epoch 1, no member) and returns its epoch; no row when a
	// concurrent statement created it (ask again). Arguments: group,
	// topic, partition, owner.
	shareLease string
	// partitions lists the partitions that have a lease in the group.
	partitions string
	// prune deletes up to a batch of a partition's rows without a dedup
	// key, from its applied mark up to below an offset, and raises the mark
	// past them in the same statement: to the first row it keeps because
	// it is younger than RetainFor, else past the batch, or to the bound
	// when fewer than a batch remain. It reads only rows at or above the
	// mark (an index range), so a round that has nothing to delete costs
	// nothing, whatever the keyed rows below the mark. Arguments: group,
	// topic, partition, bound, keep-younger-than (microseconds, 0 for
	// none), limit. It returns the rows deleted, the rows read and the new
	// mark; no row when the partition has no lease (then nothing is
	// deleted: nothing could remember it).
	prune string
	// pruneBound, with RetainFor, remembers the bound retention was given
	// for a partition (the group's committed offset) with the time it was
	// seen — unless one was seen less than a spacing ago — and returns the
	// newest bound seen at least RetainFor ago, forgetting the older ones:
	// the highest offset the applied mark may rise to. Arguments: group,
	// topic, partition, committed offset, RetainFor and spacing
	// (microseconds). It returns whether the partition has a lease (without
	// one nothing is remembered) and the bound, NULL when none is that old.
	pruneBound string
	// pruneKeys deletes up to a batch of a partition's rows with a dedup
	// key older than the dedup window and below the applied mark, found by
	// their age (an index). Arguments: group, topic, partition, window
	// (microseconds), limit.
	pruneKeys string
	// retentionClaim takes the group's retention lease for a round if it
	// is free (expired) or already this Store's. Arguments: group, holder,
	// time to live (microseconds). It returns the database's now() when it
	// took it, no row otherwise.
	retentionClaim string
	// retentionRenew extends the lease while a round runs. Arguments:
	// group, holder, time to live (microseconds).
	retentionRenew string
	// retentionRelease ends a round: the lease stays until the given time
	// (the round's start plus the interval), so the group runs one round
	// per interval whatever the number of replicas. Arguments: group,
	// holder, until.
	retentionRelease string
}

func newStatements(n names) statements {
	return statements{
		claim: `WITH lease AS (
	SELECT epoch, applied_below FROM ` + n.lease + ` WHERE group_id = $1 AND topic = $2 AND partition = $3
), claimed AS (
	INSERT INTO ` + n.inbox + ` (group_id, topic, partition, "offset", epoch, dedup_key, dedup_hash)
	SELECT $1, $2, $3, $4::bigint, lease.epoch, encode($6::bytea, 'hex'), $6::bytea FROM lease
	WHERE lease.epoch = $5::bigint AND $4::bigint >= lease.applied_below
	ON CONFLICT DO NOTHING
	RETURNING 1
)
SELECT (SELECT epoch FROM lease), EXISTS (SELECT FROM claimed), pg_current_xact_id()::text::bigint`,

		claimBatch: `WITH lease AS (
	SELECT epoch, applied_below FROM ` + n.lease + ` WHERE group_id = $1 AND topic = $2 AND partition = $3
), claimed AS (
	INSERT INTO ` + n.inbox + ` (group_id, topic, partition, "offset", epoch, dedup_key, dedup_hash)
	SELECT $1, $2, $3, r.off, lease.epoch, encode(r.h, 'hex'), r.h
	FROM lease, unnest($4::bigint[], $5::bytea[]) AS r(off, h)
	WHERE lease.epoch = $6::bigint AND r.off >= lease.applied_below
	ON CONFLICT DO NOTHING
	RETURNING "offset"
)
SELECT (SELECT epoch FROM lease), ARRAY (SELECT "offset" FROM claimed), pg_current_xact_id()::text::bigint`,

		claimRedrive: `WITH lease AS (
	SELECT epoch, applied_below FROM ` + n.lease + ` WHERE group_id = $1 AND topic = $2 AND partition = $3
), r AS (
	SELECT * FROM unnest($4::bigint[], $5::bytea[], $7::text[], $8::int[], $9::bigint[]) AS r(off, h, ot, op, oo)
), claimed AS (
	INSERT INTO ` + n.inbox + ` (group_id, topic, partition, "offset", epoch, dedup_key, dedup_hash)
	SELECT $1, $2, $3, r.off, lease.epoch, encode(r.h, 'hex'), r.h
	FROM lease, r
	WHERE lease.epoch = $6::bigint AND r.off >= lease.applied_below
	ON CONFLICT DO NOTHING
	RETURNING "offset"
), o AS (
	SELECT r.off, r.ot, r.op, r.oo, coalesce((SELECT m.applied_below FROM ` + n.lease + ` m
		WHERE m.group_id = $1 AND m.topic = r.ot AND m.partition = r.op), 0) AS below
	FROM r JOIN claimed c ON c."offset" = r.off
	WHERE r.ot IS NOT NULL
), origin AS (
	INSERT INTO ` + n.inbox + ` (group_id, topic, partition, "offset", epoch, via_topic, via_partition, via_offset)
	SELECT $1, o.ot, o.op, o.oo, 0, $2, $3, o.off FROM o
	WHERE o.oo >= o.below
	ON CONFLICT DO NOTHING
	RETURNING via_offset
)
SELECT (SELECT epoch FROM lease), ARRAY (SELECT "offset" FROM claimed), pg_current_xact_id()::text::bigint,
	ARRAY (SELECT via_offset FROM origin),
	ARRAY (SELECT o.off FROM o WHERE o.oo < o.below AND NOT EXISTS (
		SELECT FROM ` + n.inbox + ` i WHERE i.group_id = $1 AND i.topic = o.ot AND i.partition = o.op AND i."offset" = o.oo))`,

		xactStatus: `SELECT pg_xact_status($1::bigint::text::xid8)`,

		rows: `SELECT count(*) FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(t, p, o)
JOIN ` + n.inbox + ` i ON i.group_id = $1 AND i.topic = u.t AND i.partition = u.p AND i."offset" = u.o`,

		unclaim: `WITH own AS (
	DELETE FROM ` + n.inbox + ` WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" = $4
)
DELETE FROM ` + n.inbox + ` WHERE group_id = $1 AND topic = $5::text AND partition = $6::int AND "offset" = $7::bigint
	AND via_topic = $2 AND via_partition = $3 AND via_offset = $4`,

		bump: `INSERT INTO ` + n.lease + ` AS l (group_id, topic, partition, epoch, owner, member, acquired_at)
SELECT $1, u.t, u.p, 1, $2, u.m, now() FROM unnest($3::text[], $4::int[], $5::text[]) WITH ORDINALITY AS u(t, p, m, i)
ORDER BY u.i
ON CONFLICT (group_id, topic, partition) DO UPDATE
	SET epoch = l.epoch + 1, owner = EXCLUDED.owner, member = EXCLUDED.member, acquired_at = now()
RETURNING topic, partition, epoch, applied_below`,

		retake: `UPDATE ` + n.lease + ` SET epoch = epoch + 1, owner = $5, member = $6, acquired_at = now()
WHERE group_id = $1 AND topic = $2 AND partition = $3 AND ($4::bigint = 0 OR epoch = $4::bigint)
RETURNING epoch`,

		applied: `SELECT u.i::int, a."offset"
FROM unnest($2::text[], $3::int[], $4::bigint[]) WITH ORDINALITY AS u(t, p, start, i)
CROSS JOIN LATERAL (
	(SELECT "offset" FROM ` + n.inbox + `
	 WHERE group_id = $1 AND topic = u.t AND partition = u.p AND u.start >= 0 AND "offset" >= u.start
	 ORDER BY "offset" LIMIT $5)
	UNION ALL
	(SELECT "offset" FROM ` + n.inbox + `
	 WHERE group_id = $1 AND topic = u.t AND partition = u.p AND u.start < 0
	 ORDER BY "offset" DESC LIMIT $5)
) a`,

		shareLease: `WITH ins AS (
	INSERT INTO ` + n.lease + ` (group_id, topic, partition, epoch, owner) VALUES ($1, $2, $3, 1, $4)
	ON CONFLICT (group_id, topic, partition) DO NOTHING
	RETURNING epoch
)
SELECT epoch FROM ins
UNION ALL
SELECT epoch FROM ` + n.lease + ` WHERE group_id = $1 AND topic = $2 AND partition = $3
LIMIT 1`,

		partitions: `SELECT topic, partition FROM ` + n.lease + ` WHERE group_id = $1 ORDER BY topic, partition`,

		prune: `WITH lease AS (
	SELECT applied_below FROM ` + n.lease + ` WHERE group_id = $1 AND topic = $2 AND partition = $3
), scan AS (
	SELECT i.ctid, i."offset", i.applied_at FROM ` + n.inbox + ` i, lease
	WHERE i.group_id = $1 AND i.topic = $2 AND i.partition = $3
	  AND i."offset" >= lease.applied_below AND i."offset" < $4::bigint AND i.dedup_hash IS NULL
	ORDER BY i."offset"
	LIMIT $6
), stop AS (
	SELECT coalesce(
		(SELECT min("offset") FROM scan WHERE $5::bigint > 0 AND applied_at >= now() - $5::bigint * interval '1 microsecond'),
		CASE WHEN (SELECT count(*) FROM scan) < $6 THEN $4::bigint ELSE (SELECT max("offset") + 1 FROM scan) END
	) AS at
), gone AS (
	DELETE FROM ` + n.inbox + ` WHERE ctid = ANY (ARRAY (SELECT scan.ctid FROM scan, stop WHERE scan."offset" < stop.at))
	RETURNING 1
)
UPDATE ` + n.lease + ` SET applied_below = greatest(applied_below, (SELECT at FROM stop))
WHERE group_id = $1 AND topic = $2 AND partition = $3
RETURNING (SELECT count(*) FROM gone), (SELECT count(*) FROM scan), applied_below`,

		pruneBound: `WITH lease AS (
	SELECT FROM ` + n.lease + ` WHERE group_id = $1 AND topic = $2 AND partition = $3
), seen AS (
	INSERT INTO ` + n.bounds + ` (group_id, topic, partition, seen_at, bound)
	SELECT $1, $2, $3, now(), $4::bigint FROM lease
	WHERE NOT EXISTS (SELECT FROM ` + n.bounds + ` b WHERE b.group_id = $1 AND b.topic = $2 AND b.partition = $3
		AND b.seen_at > now() - $6::bigint * interval '1 microsecond')
	ON CONFLICT DO NOTHING
	RETURNING 1
), ripe AS (
	SELECT b.seen_at, b.bound FROM ` + n.bounds + ` b
	WHERE b.group_id = $1 AND b.topic = $2 AND b.partition = $3
	  AND b.seen_at <= now() - $5::bigint * interval '1 microsecond'
	ORDER BY b.seen_at DESC
	LIMIT 1
), gone AS (
	DELETE FROM ` + n.bounds + ` b WHERE b.group_id = $1 AND b.topic = $2 AND b.partition = $3
	  AND b.seen_at < (SELECT seen_at FROM ripe)
	RETURNING 1
)
SELECT EXISTS (SELECT FROM lease), (SELECT bound FROM ripe)`,

		pruneKeys: `DELETE FROM ` + n.inbox + ` WHERE ctid = ANY (ARRAY (
	SELECT i.ctid FROM ` + n.inbox + ` i
	WHERE i.group_id = $1 AND i.topic = $2 AND i.partition = $3 AND i.dedup_hash IS NOT NULL
	  AND i.applied_at < now() - $4::bigint * interval '1 microsecond'
	  AND i."offset" < (SELECT applied_below FROM ` + n.lease + ` WHERE group_id = $1 AND topic = $2 AND partition = $3)
	ORDER BY i.applied_at
	LIMIT $5
))`,

		retentionClaim: `INSERT INTO ` + n.retention + ` AS r (group_id, holder, until)
VALUES ($1, $2, now() + $3::bigint * interval '1 microsecond')
ON CONFLICT (group_id) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until
	WHERE r.until <= now() OR r.holder = EXCLUDED.holder
RETURNING now()`,

		retentionRenew: `UPDATE ` + n.retention + ` SET until = now() + $3::bigint * interval '1 microsecond'
WHERE group_id = $1 AND holder = $2`,

		retentionRelease: `UPDATE ` + n.retention + ` SET until = $3 WHERE group_id = $1 AND holder = $2`,
	}
}
