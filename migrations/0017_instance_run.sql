-- 0017_instance_run: what an instance runs (issue 12): the command that
-- replaces its image's (NULL: the image's own), the environment the user
-- gave, and the working directory ('' : the image's). The API checks every
-- bound (domain/runspec.c) before anything is stored.

-- JSON array of 1..64 strings, or NULL.
ALTER TABLE instances ADD COLUMN command TEXT CHECK (command IS NULL OR (json_valid(command) AND json_type(command) = 'array'));
-- JSON array of {"name", "value", "secret"} in the order given. Secret values
-- are kept here, since every start sends them to the agents; the API never
-- shows them (runspec.c run_env_public) and nothing logs this column.
ALTER TABLE instances ADD COLUMN env TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(env) AND json_type(env) = 'array');
ALTER TABLE instances ADD COLUMN working_dir TEXT NOT NULL DEFAULT '' CHECK (length(working_dir) <= 255);
