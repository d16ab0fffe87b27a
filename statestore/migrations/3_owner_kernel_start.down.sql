-- Rows keep the current owner format, which earlier berth releases judge on
-- the safe side: on Linux they take such owners for processes of another
-- pid namespace, which they never reap (the rows stay until released, or
-- until a current release reaps them); on macOS and Windows the start is
-- the millisecond value they compare.
DELETE FROM schema_history WHERE version = 3;
