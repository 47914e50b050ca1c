package main

// The PostgreSQL side shared by the inbox workload and the INSERT
// ceiling: the effect's table and statement, and the pool.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/pkg/runner"
)

// The effect of the inbox workload and the row of the INSERT ceiling: the
// same statement, the same row.
const (
	effectsDDL = `CREATE TABLE effects (
	id        bigserial PRIMARY KEY,
	topic     text   NOT NULL,
	partition int    NOT NULL,
	"offset"  bigint NOT NULL,
	key       bytea,
	value     bytea
)`
	effectSQL = `INSERT INTO effects (topic, partition, "offset", key, value) VALUES ($1, $2, $3, $4, $5)`
)

func insertEffect(ctx context.Context, tx pgx.Tx, rec runner.Record) error {
	_, err := tx.Exec(ctx, effectSQL, rec.Topic, rec.Partition, rec.Offset, rec.Key, rec.Value)
	return err
}

// poolConns is the pool size of the inbox consumers and of the INSERT
// ceiling alike.
const poolConns = 8

// openPool opens a pool of poolConns connections whose unqualified names
// resolve in schema.
func openPool(ctx context.Context, dsn, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// Not pgx's message: it may quote the string, password included.
		return nil, errors.New("TIDEMARK_PG_DSN is not a valid connection string")
	}
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	cfg.MaxConns = poolConns
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL does not answer: %w (scripts/testbed up && source .testbed/env)", err)
	}
	return pool, nil
}
