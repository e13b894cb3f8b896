/* backend.c: see backend.h (the choice of a backend; the backends
 * themselves are local.c and rbd.c). */
#include "backend.h"
#include "rbd.h"

const struct backend *backend_of(const struct backend_key *k)
{
    if (k->record)
        return rbd_record(k->record) ? &backend_rbd : &backend_local;
    if ((k->params && rbd_selected(k->n_params, k->params)) || rbd_is_id(k->volume_id) ||
        rbd_is_snap_id(k->snapshot_id) || rbd_is_name(k->record_name))
        return &backend_rbd;
    return &backend_local;
}
