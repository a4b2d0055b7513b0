// What the examples share: a pool from the command line's connection string, and a printer.
import { fileURLToPath } from "node:url";
import pg from "pg";

/** Prints one line of an example's story, and keeps it for its test. */
export type Say = (line: string) => void;

/** Runs `run` as a program when `meta` is the entry module: `node dist/examples/NAME.js [connection string]`. */
export function main(meta: ImportMeta, run: (pool: pg.Pool, say: Say) => Promise<void>): void {
  if (process.argv[1] !== fileURLToPath(meta.url)) return;
  const pool = new pg.Pool({ connectionString: process.argv[2] ?? "postgres://postgres@127.0.0.1/postgres" });
  pool.on("error", () => undefined);
  run(pool, (line) => console.log(line))
    .then(() => pool.end())
    .catch((err: unknown) => {
      console.error(err);
      process.exitCode = 1;
      return pool.end();
    });
}
