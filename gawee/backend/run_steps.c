/* A run of oneDNN primitive executions in one call, for gawee's oneDNN-primitives runtime
 * (gawee/backend/run_steps.py): a module's consecutive primitive steps are executed here in order, so a call of the
 * module crosses from Python into C once per run instead of once per step.
 *
 * execute is the address of the loaded library's dnnl_primitive_execute (this file does not link oneDNN: the runtime
 * may load another build of it); prims, nargs and args are each step's primitive, argument count and argument array.
 * Returns 0, or the first failing step's status with its index in *failed (the steps after it are not run).
 */

typedef int (*execute_fn)(void *primitive, void *stream, int nargs, const void *args);

int gawee_run_primitives(execute_fn execute, void *stream, long count, void *const *prims, const int *nargs,
                         void *const *args, long *failed) {
    for (long i = 0; i < count; i++) {
        int status = execute(prims[i], stream, nargs[i], args[i]);
        if (status != 0) {
            *failed = i;
            return status;
        }
    }
    return 0;
}
