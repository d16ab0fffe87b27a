package main

// envWatchArg starts the argument list of berth re-executed to remove the
// file of berth run --env-file once COMMAND has exited (see
// startEnvFileWatch).
const envWatchArg = "__berth-env-file-watch"
