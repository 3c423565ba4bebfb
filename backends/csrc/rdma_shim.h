/* The libfabric calls the rdma backend uses, as plain functions: most of libfabric's API is `static inline`
 * (dispatch through the provider's ops tables), which Rust cannot call directly. Each wrapper only forwards
 * its arguments; `te_getinfo` also fills the hints the backend asks every provider for. */
#ifndef TE_RDMA_SHIM_H
#define TE_RDMA_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

/* The API version the backend is written against (the installed headers are 1.17). */
uint32_t te_api_version(void);

/* Providers offering reliable datagram endpoints with messages and RMA writes with remote CQ data.
 * `prov` (e.g. "tcp;ofi_rxm", "shm") and `domain` may be NULL for any. */
/* With `hmem`, also asks for device memory registration (FI_HMEM, FI_MR_HMEM). */
int te_getinfo(const char *prov, const char *domain, int hmem, struct fi_info **out);
uint64_t te_info_caps(struct fi_info *info);
void te_freeinfo(struct fi_info *info);

/* Fields of one fi_info. */
struct fi_info *te_info_next(struct fi_info *info);
const char *te_info_prov(struct fi_info *info);
const char *te_info_domain(struct fi_info *info);
uint64_t te_info_mr_mode(struct fi_info *info);
size_t te_info_cq_data_size(struct fi_info *info);
size_t te_info_max_msg_size(struct fi_info *info);
size_t te_info_mr_key_size(struct fi_info *info);

int te_fabric(struct fi_info *info, struct fid_fabric **fabric);
int te_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain);
int te_av_open(struct fid_domain *domain, struct fid_av **av);
/* A completion queue of fi_cq_data_entry; `wait` asks for a wait object when non-zero (the backend polls: 0). */
int te_cq_open(struct fid_domain *domain, size_t size, int wait, struct fid_cq **cq);
int te_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep);
/* Binds `av` and `cq` (for transmit and receive) to `ep` and enables it. */
int te_ep_setup(struct fid_ep *ep, struct fid_av *av, struct fid_cq *cq);
int te_getname(struct fid_ep *ep, void *addr, size_t *len);
int te_av_insert(struct fid_av *av, const void *addr, fi_addr_t *out);
int te_close_fabric(struct fid_fabric *f);
int te_close_domain(struct fid_domain *d);
int te_close_av(struct fid_av *av);
int te_close_cq(struct fid_cq *cq);
int te_close_ep(struct fid_ep *ep);
int te_close_mr(struct fid_mr *mr);

/* Registers `len` bytes at `buf` for `access` (FI_SEND, FI_RECV, FI_WRITE, FI_REMOTE_WRITE); binds the
 * registration to `ep` and enables it when `ep` is not NULL (FI_MR_ENDPOINT). */
int te_mr_reg(struct fid_domain *domain, struct fid_ep *ep, void *buf, size_t len, uint64_t access,
              uint64_t requested_key, struct fid_mr **mr);
/* As te_mr_reg, for `len` bytes of memory of CUDA device `device` (fi_mr_regattr, FI_HMEM_CUDA). */
int te_mr_reg_cuda(struct fid_domain *domain, struct fid_ep *ep, void *buf, size_t len, uint64_t access,
                   uint64_t requested_key, int device, struct fid_mr **mr);
uint64_t te_mr_key(struct fid_mr *mr);
void *te_mr_desc(struct fid_mr *mr);

ssize_t te_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, void *ctx);
ssize_t te_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, void *ctx);
ssize_t te_writedata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data,
                     fi_addr_t dest, uint64_t addr, uint64_t key, void *ctx);
ssize_t te_write(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t addr,
                 uint64_t key, void *ctx);

/* One write with explicit flags (FI_REMOTE_CQ_DATA with `data`, FI_DELIVERY_COMPLETE, ...): fi_writemsg. */
ssize_t te_writemsg(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest,
                    uint64_t addr, uint64_t key, void *ctx, uint64_t flags);

/* Up to `count` completions into `buf`; -FI_EAGAIN when none, -FI_EAVAIL when an error is queued. */
ssize_t te_cq_read(struct fid_cq *cq, struct fi_cq_data_entry *buf, size_t count);
/* The queued error completion: its context, provider error number and message. */
ssize_t te_cq_readerr(struct fid_cq *cq, void **ctx, int *err, int *prov_err, char *msg, size_t msg_len);

#endif
