/**
 * Numbered migrations, applied in order by kysely's Migrator and recorded in
 * `idem_migration`. Each is plain SQL per dialect: the schema is the contract, so it is written
 * out rather than generated.
 */
import { sql, type Kysely, type Migration, type MigrationProvider } from "kysely";
import * as m0001 from "./0001-init.js";
import * as m0002 from "./0002-lean-rows.js";
import * as m0003 from "./0003-sticky-maybe-committed.js";
import * as m0004 from "./0004-resolutions.js";
import * as m0005 from "./0005-claim-writes-its-event.js";
import * as m0006 from "./0006-operator-indexes.js";
import * as m0007 from "./0007-retention-per-operation.js";
import * as m0008 from "./0008-daemon-heartbeats.js";
import * as m0009 from "./0009-first-execution.js";
import * as m0010 from "./0010-transitions-write-their-event.js";
import * as m0011 from "./0011-due-rows-have-args.js";
import * as m0012 from "./0012-look-first-after-retry.js";
import * as m0013 from "./0013-rerun-attempt.js";

export type DialectName = "sqlite" | "postgres";

const ALL: Record<string, Record<DialectName, string[]>> = {
  "0001-init": m0001,
  "0002-lean-rows": m0002,
  "0003-sticky-maybe-committed": m0003,
  "0004-resolutions": m0004,
  "0005-claim-writes-its-event": m0005,
  "0006-operator-indexes": m0006,
  "0007-retention-per-operation": m0007,
  "0008-daemon-heartbeats": m0008,
  "0009-first-execution": m0009,
  [m0010.NAME]: m0010,
  "0011-due-rows-have-args": m0011,
  [m0012.NAME]: m0012,
  [m0013.NAME]: m0013,
};

export const MIGRATION_NAMES = Object.keys(ALL);

export function migrationProvider(dialect: DialectName): MigrationProvider {
  return {
    async getMigrations() {
      const out: Record<string, Migration> = {};
      for (const [name, perDialect] of Object.entries(ALL)) {
        out[name] = {
          async up(db: Kysely<unknown>) {
            for (const statement of perDialect[dialect]) await sql.raw(statement).execute(db);
          },
        };
      }
      return out;
    },
  };
}
