/* hp_mesh: N-d device mesh (PyTorch DeviceMesh). Layout arange(n).view(shape) over a base
 * communicator; one communicator per dim from hp_comm_split(color = index of the group row
 * of mesh.swapdims(-1, d).reshape(-1, size(d)), key = coordinate); slices share them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/mesh.h"

#define MAXD HP_MESH_MAX_DIMS

/* Every mesh remembers the root mesh it came from (the one hp_mesh_create or
 * hp_mesh_from_comm built), so that a flatten of a slice can compute one split color that
 * is unique over the whole base communicator. */
typedef struct hp_mesh_root {
    int ndim;
    int64_t shape[MAXD];
    int in_mesh;
    int coord[MAXD];   /* this rank's root coordinate (valid when in_mesh) */
} hp_mesh_root_t;

struct hp_mesh {
    int ndim;
    int64_t shape[MAXD];
    int named;
    char names[MAXD][HP_MESH_NAME_MAX];
    int64_t numel;
    int *ranks;                 /* (numel) base ranks, row-major over shape */
    int in_mesh;
    int coord[MAXD];
    hp_comm_t comms[MAXD];      /* NULL when not in the mesh */
    int owns_comm[MAXD];
    hp_comm_t base;             /* not owned */
    hp_mesh_root_t root;
    int nroot[MAXD];            /* root dims that mesh dim d spans, outermost first */
    int rootdim[MAXD][MAXD];
};

static int64_t prod64(int n, const int64_t *s) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) p *= s[i];
    return p;
}

static void names_list(hp_mesh_t m, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    used += (size_t)snprintf(buf + used, n - used, "(");
    for (int d = 0; d < m->ndim && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s'%s'", d ? ", " : "",
                                 m->named ? m->names[d] : "");
    if (used < n) snprintf(buf + used, n - used, ")");
}

static hp_mesh_t mesh_alloc(void) {
    hp_mesh_t m = hp_calloc(1, sizeof(*m));
    return m;
}

static hp_status_t check_names(int ndim, int nnames, const char *const *names) {
    if (nnames == 0 || names == NULL) return HP_OK;
    if (nnames != ndim)
        return hp_error(HP_ERR_INVALID_ARG,
                        "mesh_shape and mesh_dim_names should have same length! Found %d dims "
                        "and %d names; give one name per mesh dim or none", ndim, nnames);
    for (int i = 0; i < ndim; i++) {
        if (names[i] == NULL || names[i][0] == 0)
            return hp_error(HP_ERR_INVALID_ARG, "mesh_dim_names[%d] is empty; every mesh dim "
                            "needs a non-empty name (or pass no names)", i);
        if (strlen(names[i]) >= HP_MESH_NAME_MAX)
            return hp_error(HP_ERR_INVALID_ARG, "mesh_dim_names[%d] '%s' is longer than %d "
                            "characters", i, names[i], HP_MESH_NAME_MAX - 1);
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return hp_error(HP_ERR_INVALID_ARG, "Each mesh_dim_name must be unique. Found "
                                "repeated mesh_dim_name '%s' at dims %d and %d", names[i], j, i);
    }
    return HP_OK;
}

/* Row index of coordinate c in mesh.swapdims(-1, d).reshape(-1, shape[d]). */
static int group_row_index(int ndim, const int64_t *shape, const int *c, int d) {
    int perm[MAXD];
    for (int i = 0; i < ndim; i++) perm[i] = i;
    perm[d] = ndim - 1;
    perm[ndim - 1] = d;
    int64_t idx = 0;
    for (int i = 0; i < ndim - 1; i++) idx = idx * shape[perm[i]] + c[perm[i]];
    return (int)idx;
}

static void unravel(int64_t lin, int ndim, const int64_t *shape, int *c) {
    for (int i = ndim - 1; i >= 0; i--) {
        c[i] = (int)(lin % shape[i]);
        lin /= shape[i];
    }
}

static int64_t ravel(int ndim, const int64_t *shape, const int *c) {
    int64_t lin = 0;
    for (int i = 0; i < ndim; i++) lin = lin * shape[i] + c[i];
    return lin;
}

hp_status_t hp_mesh_create_n(hp_comm_t comm, int ndim, const int64_t *shape, int nnames,
                             const char *const *dim_names, hp_mesh_t *out) {
    *out = NULL;
    if (comm == NULL) return hp_error(HP_ERR_INVALID_ARG, "hp_mesh_create: comm is NULL");
    if (ndim < 1 || ndim > MAXD)
        return hp_error(HP_ERR_INVALID_ARG, "hp_mesh_create: mesh_shape has %d dims; expected "
                        "1..%d", ndim, MAXD);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 1)
            return hp_error(HP_ERR_INVALID_ARG, "hp_mesh_create: mesh_shape[%d] = %lld; every "
                            "mesh dim needs size >= 1", i, (long long)shape[i]);
    HP_TRY(check_names(ndim, dim_names ? nnames : 0, dim_names));
    int64_t numel = prod64(ndim, shape);
    int size = hp_comm_size(comm);
    if (numel > size)
        return hp_error(HP_ERR_INVALID_ARG, "Mesh should not be bigger than default world size "
                        "%d, but found %lld ranks! (mesh_shape product); run with more ranks or "
                        "a smaller mesh", size, (long long)numel);

    hp_mesh_t m = mesh_alloc();
    if (!m) return HP_ERR_OOM;
    m->ranks = hp_malloc((size_t)numel * sizeof(int));
    if (!m->ranks) { free(m); return HP_ERR_OOM; }
    m->ndim = ndim;
    memcpy(m->shape, shape, (size_t)ndim * sizeof(int64_t));
    m->numel = numel;
    for (int64_t i = 0; i < numel; i++) m->ranks[i] = (int)i;
    m->named = dim_names != NULL && nnames > 0;
    for (int i = 0; m->named && i < ndim; i++)
        snprintf(m->names[i], HP_MESH_NAME_MAX, "%s", dim_names[i]);
    m->base = comm;
    int r = hp_comm_rank(comm);
    m->in_mesh = r < numel;
    if (m->in_mesh) unravel(r, ndim, shape, m->coord);
    m->root.ndim = ndim;
    memcpy(m->root.shape, shape, (size_t)ndim * sizeof(int64_t));
    m->root.in_mesh = m->in_mesh;
    memcpy(m->root.coord, m->coord, sizeof(m->coord));
    for (int d = 0; d < ndim; d++) {
        m->nroot[d] = 1;
        m->rootdim[d][0] = d;
    }
    for (int d = 0; d < ndim; d++) {
        int color = m->in_mesh ? group_row_index(ndim, shape, m->coord, d) : -1;
        int key = m->in_mesh ? m->coord[d] : 0;
        hp_status_t st = hp_comm_split(comm, color, key, &m->comms[d]);
        if (st != HP_OK) {
            hp_mesh_destroy(m);
            return st;
        }
        m->owns_comm[d] = 1;
    }
    *out = m;
    return HP_OK;
}

hp_status_t hp_mesh_create(hp_comm_t comm, int ndim, const int64_t *shape,
                           const char *const *dim_names, hp_mesh_t *out) {
    return hp_mesh_create_n(comm, ndim, shape, dim_names ? ndim : 0, dim_names, out);
}

hp_status_t hp_mesh_from_comm(hp_comm_t comm, const char *dim_name, hp_mesh_t *out) {
    *out = NULL;
    if (comm == NULL) return hp_error(HP_ERR_INVALID_ARG, "hp_mesh_from_comm: comm is NULL");
    const char *names[1] = {dim_name};
    HP_TRY(check_names(1, dim_name ? 1 : 0, names));
    hp_mesh_t m = mesh_alloc();
    if (!m) return HP_ERR_OOM;
    int n = hp_comm_size(comm);
    m->ranks = hp_malloc((size_t)n * sizeof(int));
    if (!m->ranks) { free(m); return HP_ERR_OOM; }
    for (int i = 0; i < n; i++) m->ranks[i] = i;
    m->ndim = 1;
    m->shape[0] = n;
    m->numel = n;
    m->named = dim_name != NULL;
    if (dim_name) snprintf(m->names[0], HP_MESH_NAME_MAX, "%s", dim_name);
    m->base = comm;
    m->in_mesh = 1;
    m->coord[0] = hp_comm_rank(comm);
    m->comms[0] = comm;       /* DeviceMesh.from_group uses the group itself */
    m->owns_comm[0] = 0;
    m->root.ndim = 1;
    m->root.shape[0] = n;
    m->root.in_mesh = 1;
    m->root.coord[0] = m->coord[0];
    m->nroot[0] = 1;
    m->rootdim[0][0] = 0;
    *out = m;
    return HP_OK;
}

void hp_mesh_destroy(hp_mesh_t m) {
    if (!m) return;
    for (int d = 0; d < m->ndim; d++)
        if (m->owns_comm[d] && m->comms[d]) hp_comm_destroy(m->comms[d]);
    free(m->ranks);
    free(m);
}

int hp_mesh_ndim(hp_mesh_t m) { return m->ndim; }

int64_t hp_mesh_size(hp_mesh_t m, int dim) {
    if (dim < 0) return m->numel;
    HP_ASSERT_MSG(dim < m->ndim, "hp_mesh_size: dim %d out of range for a %d-d mesh", dim, m->ndim);
    return m->shape[dim];
}

const char *hp_mesh_dim_name(hp_mesh_t m, int dim) {
    if (dim < 0 || dim >= m->ndim || !m->named) return NULL;
    return m->names[dim];
}

hp_status_t hp_mesh_dim_index(hp_mesh_t m, const char *name, int *dim) {
    char valid[MAXD * (HP_MESH_NAME_MAX + 4) + 8];
    if (!m->named)
        return hp_error(HP_ERR_NOT_FOUND, "Cannot slice a DeviceMesh without mesh_dim_names! "
                        "(looked up '%s'); create the mesh with dim names", name ? name : "(null)");
    for (int d = 0; d < m->ndim; d++)
        if (name && strcmp(m->names[d], name) == 0) {
            *dim = d;
            return HP_OK;
        }
    names_list(m, valid, sizeof(valid));
    return hp_error(HP_ERR_NOT_FOUND, "Invalid mesh_dim_names ('%s',) specified. Valid "
                    "mesh_dim_names are %s.", name ? name : "(null)", valid);
}

hp_comm_t hp_mesh_get_comm(hp_mesh_t m, int dim) {
    HP_ASSERT_MSG(dim >= 0 && dim < m->ndim, "hp_mesh_get_comm: dim %d out of range for a %d-d mesh",
                  dim, m->ndim);
    return m->in_mesh ? m->comms[dim] : NULL;
}

int hp_mesh_get_coordinate(hp_mesh_t m, int *coord) {
    if (!m->in_mesh) return 0;
    if (coord) memcpy(coord, m->coord, (size_t)m->ndim * sizeof(int));
    return 1;
}

int hp_mesh_contains_self(hp_mesh_t m) { return m->in_mesh; }

int hp_mesh_get_local_rank(hp_mesh_t m, int dim) {
    HP_ASSERT_MSG(dim >= 0 && dim < m->ndim, "hp_mesh_get_local_rank: dim %d out of range for a "
                  "%d-d mesh", dim, m->ndim);
    return m->in_mesh ? m->coord[dim] : -1;
}

int hp_mesh_rank_at(hp_mesh_t m, const int *coord) {
    for (int d = 0; d < m->ndim; d++)
        if (coord[d] < 0 || coord[d] >= m->shape[d]) return -1;
    return m->ranks[ravel(m->ndim, m->shape, coord)];
}

int hp_mesh_group_ranks(hp_mesh_t m, int dim, int *ranks) {
    if (!m->in_mesh) return 0;
    HP_ASSERT(dim >= 0 && dim < m->ndim);
    int c[MAXD];
    memcpy(c, m->coord, sizeof(c));
    for (int i = 0; i < m->shape[dim]; i++) {
        c[dim] = i;
        ranks[i] = hp_mesh_rank_at(m, c);
    }
    return (int)m->shape[dim];
}

hp_comm_t hp_mesh_base_comm(hp_mesh_t m) { return m->base; }

int hp_mesh_equal(hp_mesh_t a, hp_mesh_t b) {
    if (a == b) return 1;
    if (!a || !b || a->ndim != b->ndim || a->named != b->named || a->base != b->base) return 0;
    for (int d = 0; d < a->ndim; d++) {
        if (a->shape[d] != b->shape[d]) return 0;
        if (a->named && strcmp(a->names[d], b->names[d]) != 0) return 0;
    }
    return memcmp(a->ranks, b->ranks, (size_t)a->numel * sizeof(int)) == 0;
}

/* Looks up n names (distinct) into dims[]. */
static hp_status_t lookup_names(hp_mesh_t m, int n, const char *const *names, int *dims,
                                const char *what) {
    if (n < 1 || n > m->ndim)
        return hp_error(HP_ERR_INVALID_ARG, "%s: %d dim names given for a %d-d mesh; expected "
                        "1..%d", what, n, m->ndim, m->ndim);
    for (int i = 0; i < n; i++) {
        HP_TRY(hp_mesh_dim_index(m, names[i], &dims[i]));
        for (int j = 0; j < i; j++)
            if (dims[j] == dims[i])
                return hp_error(HP_ERR_INVALID_ARG, "%s: mesh dim name '%s' given twice; each "
                                "dim may appear once", what, names[i]);
    }
    return HP_OK;
}

/* Sub-mesh over parent dims groups[g] (each group a list of parent dims flattened into one
 * new dim), other dims fixed at this rank's coordinate. Comms are not set here. */
static hp_status_t make_sub(hp_mesh_t p, int ng, const int *gn, int gd[][MAXD], hp_mesh_t *out) {
    hp_mesh_t m = mesh_alloc();
    if (!m) return HP_ERR_OOM;
    m->ndim = ng;
    m->numel = 1;
    for (int g = 0; g < ng; g++) {
        m->shape[g] = 1;
        m->nroot[g] = 0;
        for (int i = 0; i < gn[g]; i++) {
            int pd = gd[g][i];
            m->shape[g] *= p->shape[pd];
            for (int k = 0; k < p->nroot[pd]; k++) m->rootdim[g][m->nroot[g]++] = p->rootdim[pd][k];
        }
        m->numel *= m->shape[g];
    }
    m->ranks = hp_malloc((size_t)m->numel * sizeof(int));
    if (!m->ranks) { free(m); return HP_ERR_OOM; }
    int pc[MAXD];
    for (int d = 0; d < p->ndim; d++) pc[d] = p->in_mesh ? p->coord[d] : 0;
    int sc[MAXD];
    for (int64_t lin = 0; lin < m->numel; lin++) {
        unravel(lin, ng, m->shape, sc);
        for (int g = 0; g < ng; g++) {
            int64_t c = sc[g];
            for (int i = gn[g] - 1; i >= 0; i--) {
                int pd = gd[g][i];
                pc[gd[g][i]] = (int)(c % p->shape[pd]);
                c /= p->shape[pd];
            }
        }
        m->ranks[lin] = p->ranks[ravel(p->ndim, p->shape, pc)];
    }
    m->in_mesh = p->in_mesh;
    for (int g = 0; g < ng && m->in_mesh; g++) {
        int64_t c = 0;
        for (int i = 0; i < gn[g]; i++) c = c * p->shape[gd[g][i]] + p->coord[gd[g][i]];
        m->coord[g] = (int)c;
    }
    m->base = p->base;
    m->root = p->root;
    *out = m;
    return HP_OK;
}

hp_status_t hp_mesh_slice(hp_mesh_t mesh, int n, const char *const *names, hp_mesh_t *out) {
    *out = NULL;
    int dims[MAXD];
    HP_TRY(lookup_names(mesh, n, names, dims, "hp_mesh_slice"));
    int gn[MAXD] = {0}, gd[MAXD][MAXD] = {{0}};
    for (int i = 0; i < n; i++) {
        gn[i] = 1;
        gd[i][0] = dims[i];
    }
    hp_mesh_t m;
    HP_TRY(make_sub(mesh, n, gn, gd, &m));
    m->named = 1;
    for (int i = 0; i < n; i++) {
        snprintf(m->names[i], HP_MESH_NAME_MAX, "%s", mesh->names[dims[i]]);
        m->comms[i] = mesh->comms[dims[i]];
        m->owns_comm[i] = 0;
    }
    *out = m;
    return HP_OK;
}

hp_status_t hp_mesh_flatten(hp_mesh_t mesh, int n, const char *const *names,
                            const char *new_name, hp_mesh_t *out) {
    *out = NULL;
    int dims[MAXD];
    HP_TRY(lookup_names(mesh, n, names, dims, "hp_mesh_flatten"));
    char joined[HP_MESH_NAME_MAX * MAXD];
    if (!new_name) {
        size_t used = 0;
        joined[0] = 0;
        for (int i = 0; i < n; i++)
            used += (size_t)snprintf(joined + used, sizeof(joined) - used, "%s%s", i ? "_" : "",
                                     names[i]);
        new_name = joined;
    }
    if (new_name[0] == 0 || strlen(new_name) >= HP_MESH_NAME_MAX)
        return hp_error(HP_ERR_INVALID_ARG, "hp_mesh_flatten: new dim name '%s' must have 1..%d "
                        "characters", new_name, HP_MESH_NAME_MAX - 1);
    int gn[1] = {n}, gd[1][MAXD] = {{0}};
    for (int i = 0; i < n; i++) gd[0][i] = dims[i];
    hp_mesh_t m;
    HP_TRY(make_sub(mesh, 1, gn, gd, &m));
    m->named = 1;
    memcpy(m->names[0], new_name, strlen(new_name) + 1);   /* length checked above */
    if (n == 1) {
        m->comms[0] = mesh->comms[dims[0]];
        m->owns_comm[0] = 0;
        *out = m;
        return HP_OK;
    }
    /* color: this rank's root coordinate over the root dims NOT flattened (unique over the
     * whole base communicator); key: the flattened coordinate. */
    int color = -1, key = 0;
    if (m->root.in_mesh) {
        int inflat[MAXD] = {0};
        for (int k = 0; k < m->nroot[0]; k++) inflat[m->rootdim[0][k]] = 1;
        int64_t c = 0;
        for (int rd = 0; rd < m->root.ndim; rd++)
            if (!inflat[rd]) c = c * m->root.shape[rd] + m->root.coord[rd];
        color = (int)c;
        key = m->coord[0];
    }
    hp_status_t st = hp_comm_split(mesh->base, color, key, &m->comms[0]);
    if (st != HP_OK) {
        hp_mesh_destroy(m);
        return st;
    }
    m->owns_comm[0] = 1;
    if (!m->in_mesh && m->comms[0]) { /* in the root but not in this slice's parent */
        hp_comm_destroy(m->comms[0]);
        m->comms[0] = NULL;
    }
    *out = m;
    return HP_OK;
}

/* Appends the nested rank list of dims [d..ndim) starting at linear offset `base`. */
static size_t put_ranks(hp_mesh_t m, int d, int64_t base, char *buf, size_t used, size_t n) {
    if (used >= n) return used;
    used += (size_t)snprintf(buf + used, n - used, "[");
    int64_t inner = prod64(m->ndim - d - 1, m->shape + d + 1);
    for (int64_t i = 0; i < m->shape[d] && used < n; i++) {
        if (i) used += (size_t)snprintf(buf + used, n - used, ",");
        if (used >= n) break;
        if (d == m->ndim - 1)
            used += (size_t)snprintf(buf + used, n - used, "%d", m->ranks[base + i]);
        else
            used = put_ranks(m, d + 1, base + i * inner, buf, used, n);
    }
    if (used < n) used += (size_t)snprintf(buf + used, n - used, "]");
    return used;
}

hp_status_t hp_mesh_concat(hp_mesh_t a, hp_mesh_t b, hp_mesh_t *out) {
    *out = NULL;
    if (!a || !b) return hp_error(HP_ERR_INVALID_ARG, "hp_mesh_concat: a mesh is NULL");
    char sa[256], sb[256];
    int same_root = a->base == b->base && a->root.ndim == b->root.ndim;
    for (int i = 0; same_root && i < a->root.ndim; i++) same_root = a->root.shape[i] == b->root.shape[i];
    if (!same_root)
        return hp_error(HP_ERR_INVALID_ARG, "hp_mesh_concat: %s and %s are not slices of one DeviceMesh; hint: "
                        "slice both from the same mesh (mesh[\"dp_shard\"] and mesh[\"tp\"])",
                        hp_mesh_str(a, sa, sizeof sa), hp_mesh_str(b, sb, sizeof sb));
    const int nd = a->ndim + b->ndim;
    if (nd > MAXD)
        return hp_error(HP_ERR_INVALID_ARG, "hp_mesh_concat: %d dims; at most %d", nd, MAXD);
    if (a->named != b->named)
        return hp_error(HP_ERR_INVALID_ARG, "hp_mesh_concat: %s and %s: one is named, the other not; name "
                        "both or neither", hp_mesh_str(a, sa, sizeof sa), hp_mesh_str(b, sb, sizeof sb));
    int used[MAXD] = {0};
    hp_mesh_t parts[2] = {a, b};
    for (int k = 0; k < 2; k++)
        for (int d = 0; d < parts[k]->ndim; d++)
            for (int i = 0; i < parts[k]->nroot[d]; i++) {
                int rd = parts[k]->rootdim[d][i];
                if (used[rd]++)
                    return hp_error(HP_ERR_INVALID_ARG, "hp_mesh_concat: %s and %s share a dim of their root "
                                    "mesh; the dims must be disjoint", hp_mesh_str(a, sa, sizeof sa),
                                    hp_mesh_str(b, sb, sizeof sb));
            }
    if (a->named)
        for (int i = 0; i < a->ndim; i++)
            for (int j = 0; j < b->ndim; j++)
                if (strcmp(a->names[i], b->names[j]) == 0)
                    return hp_error(HP_ERR_INVALID_ARG, "hp_mesh_concat: dim name '%s' is in both meshes",
                                    a->names[i]);
    hp_mesh_t m = mesh_alloc();
    if (!m) return HP_ERR_OOM;
    m->ndim = nd;
    m->named = a->named;
    m->numel = a->numel * b->numel;
    m->base = a->base;
    m->root = a->root;
    m->in_mesh = a->in_mesh && b->in_mesh && a->root.in_mesh;
    for (int g = 0, k = 0; k < 2; k++)
        for (int d = 0; d < parts[k]->ndim; d++, g++) {
            hp_mesh_t p = parts[k];
            m->shape[g] = p->shape[d];
            m->nroot[g] = p->nroot[d];
            memcpy(m->rootdim[g], p->rootdim[d], sizeof(m->rootdim[g]));
            if (m->named) snprintf(m->names[g], HP_MESH_NAME_MAX, "%s", p->names[d]);
            m->coord[g] = p->coord[d];
            m->comms[g] = p->comms[d];
            m->owns_comm[g] = 0;
        }
    m->ranks = hp_malloc((size_t)m->numel * sizeof(int));
    if (!m->ranks) { free(m); return HP_ERR_OOM; }
    /* root coordinate: this rank's, with the concatenated dims' root dims replaced; the
     * root's rank layout is arange(prod(shape)) over the base communicator */
    int rc[MAXD], sc[MAXD];
    for (int64_t lin = 0; lin < m->numel; lin++) {
        for (int i = 0; i < m->root.ndim; i++) rc[i] = m->root.in_mesh ? m->root.coord[i] : 0;
        unravel(lin, nd, m->shape, sc);
        for (int g = 0; g < nd; g++) {
            int64_t c = sc[g];
            for (int i = m->nroot[g] - 1; i >= 0; i--) {
                int rd = m->rootdim[g][i];
                rc[rd] = (int)(c % m->root.shape[rd]);
                c /= m->root.shape[rd];
            }
        }
        m->ranks[lin] = (int)ravel(m->root.ndim, m->root.shape, rc);
    }
    *out = m;
    return HP_OK;
}

const char *hp_mesh_str(hp_mesh_t m, char *buf, size_t n) {
    if (n == 0) return buf;
    size_t used = (size_t)snprintf(buf, n, "DeviceMesh((");
    for (int d = 0; d < m->ndim && used < n; d++) {
        if (m->named)
            used += (size_t)snprintf(buf + used, n - used, "%s%s=%lld", d ? ", " : "", m->names[d],
                                     (long long)m->shape[d]);
        else
            used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "",
                                     (long long)m->shape[d]);
    }
    if (used < n) used += (size_t)snprintf(buf + used, n - used, "), ranks ");
    if (used < n) used = put_ranks(m, 0, 0, buf, used, n);
    if (used < n) snprintf(buf + used, n - used, ")");
    return buf;
}
