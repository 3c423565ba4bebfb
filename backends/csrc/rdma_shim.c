/* Plain-function wrappers over libfabric's static inline calls; see rdma_shim.h. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "rdma_shim.h"

uint32_t te_api_version(void) { return FI_VERSION(1, 17); }

int te_getinfo(const char *prov, const char *domain, int hmem, struct fi_info **out) {
    struct fi_info *hints = fi_allocinfo();
    if (!hints)
        return -FI_ENOMEM;
    hints->caps = FI_MSG | FI_RMA | FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE;
    hints->mode = 0;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    if (hmem) {
        hints->caps |= FI_HMEM;
        hints->domain_attr->mr_mode |= FI_MR_HMEM;
    }
    if (prov)
        hints->fabric_attr->prov_name = strdup(prov);
    if (domain)
        hints->domain_attr->name = strdup(domain);
    int ret = fi_getinfo(te_api_version(), NULL, NULL, 0, hints, out);
    fi_freeinfo(hints);
    return ret;
}

void te_freeinfo(struct fi_info *info) { fi_freeinfo(info); }
struct fi_info *te_info_next(struct fi_info *info) { return info->next; }
uint64_t te_info_caps(struct fi_info *info) { return info->caps; }
const char *te_info_prov(struct fi_info *info) { return info->fabric_attr->prov_name; }
const char *te_info_domain(struct fi_info *info) { return info->domain_attr->name; }
uint64_t te_info_mr_mode(struct fi_info *info) { return (uint64_t)info->domain_attr->mr_mode; }
size_t te_info_cq_data_size(struct fi_info *info) { return info->domain_attr->cq_data_size; }
size_t te_info_max_msg_size(struct fi_info *info) { return info->ep_attr->max_msg_size; }
size_t te_info_mr_key_size(struct fi_info *info) { return info->domain_attr->mr_key_size; }

int te_fabric(struct fi_info *info, struct fid_fabric **fabric) {
    return fi_fabric(info->fabric_attr, fabric, NULL);
}

int te_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain) {
    return fi_domain(fabric, info, domain, NULL);
}

int te_av_open(struct fid_domain *domain, struct fid_av **av) {
    struct fi_av_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.type = FI_AV_MAP;
    return fi_av_open(domain, &attr, av, NULL);
}

int te_cq_open(struct fid_domain *domain, size_t size, int wait, struct fid_cq **cq) {
    struct fi_cq_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = size;
    attr.format = FI_CQ_FORMAT_DATA;
    attr.wait_obj = wait ? FI_WAIT_UNSPEC : FI_WAIT_NONE;
    return fi_cq_open(domain, &attr, cq, NULL);
}

int te_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep) {
    return fi_endpoint(domain, info, ep, NULL);
}

int te_ep_setup(struct fid_ep *ep, struct fid_av *av, struct fid_cq *cq) {
    int ret = fi_ep_bind(ep, &av->fid, 0);
    if (ret)
        return ret;
    ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV);
    if (ret)
        return ret;
    return fi_enable(ep);
}

int te_getname(struct fid_ep *ep, void *addr, size_t *len) { return fi_getname(&ep->fid, addr, len); }

int te_av_insert(struct fid_av *av, const void *addr, fi_addr_t *out) {
    int ret = fi_av_insert(av, addr, 1, out, 0, NULL);
    return ret == 1 ? 0 : (ret < 0 ? ret : -FI_EINVAL);
}

int te_close_fabric(struct fid_fabric *f) { return fi_close(&f->fid); }
int te_close_domain(struct fid_domain *d) { return fi_close(&d->fid); }
int te_close_av(struct fid_av *av) { return fi_close(&av->fid); }
int te_close_cq(struct fid_cq *cq) { return fi_close(&cq->fid); }
int te_close_ep(struct fid_ep *ep) { return fi_close(&ep->fid); }
int te_close_mr(struct fid_mr *mr) { return fi_close(&mr->fid); }

/* Binds a new registration to `ep` and enables it (FI_MR_ENDPOINT); closes it on failure. */
static int bind_enable(struct fid_ep *ep, struct fid_mr **mr) {
    int ret = fi_mr_bind(*mr, &ep->fid, 0);
    if (!ret)
        ret = fi_mr_enable(*mr);
    if (ret) {
        fi_close(&(*mr)->fid);
        *mr = NULL;
    }
    return ret;
}

int te_mr_reg(struct fid_domain *domain, struct fid_ep *ep, void *buf, size_t len, uint64_t access,
              uint64_t requested_key, struct fid_mr **mr) {
    int ret = fi_mr_reg(domain, buf, len, access, 0, requested_key, 0, mr, NULL);
    if (ret || !ep)
        return ret;
    return bind_enable(ep, mr);
}

int te_mr_reg_cuda(struct fid_domain *domain, struct fid_ep *ep, void *buf, size_t len, uint64_t access,
                   uint64_t requested_key, int device, struct fid_mr **mr) {
    struct iovec iov = { .iov_base = buf, .iov_len = len };
    struct fi_mr_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = access;
    attr.requested_key = requested_key;
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = device;
    int ret = fi_mr_regattr(domain, &attr, 0, mr);
    if (ret || !ep)
        return ret;
    return bind_enable(ep, mr);
}

uint64_t te_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }
void *te_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }

ssize_t te_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, void *ctx) {
    return fi_send(ep, buf, len, desc, dest, ctx);
}

ssize_t te_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, void *ctx) {
    return fi_recv(ep, buf, len, desc, FI_ADDR_UNSPEC, ctx);
}

ssize_t te_writedata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data,
                     fi_addr_t dest, uint64_t addr, uint64_t key, void *ctx) {
    return fi_writedata(ep, buf, len, desc, data, dest, addr, key, ctx);
}

ssize_t te_write(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t addr,
                 uint64_t key, void *ctx) {
    return fi_write(ep, buf, len, desc, dest, addr, key, ctx);
}

ssize_t te_writemsg(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest,
                    uint64_t addr, uint64_t key, void *ctx, uint64_t flags) {
    struct iovec iov = {(void *)buf, len};
    struct fi_rma_iov rma = {addr, len, key};
    struct fi_msg_rma msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = dest;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = ctx;
    msg.data = data;
    return fi_writemsg(ep, &msg, flags | FI_COMPLETION);
}

ssize_t te_cq_read(struct fid_cq *cq, struct fi_cq_data_entry *buf, size_t count) {
    return fi_cq_read(cq, buf, count);
}

ssize_t te_cq_readerr(struct fid_cq *cq, void **ctx, int *err, int *prov_err, char *msg, size_t msg_len) {
    struct fi_cq_err_entry e;
    memset(&e, 0, sizeof e);
    ssize_t ret = fi_cq_readerr(cq, &e, 0);
    if (ret < 0)
        return ret;
    *ctx = e.op_context;
    *err = e.err;
    *prov_err = e.prov_errno;
    if (msg && msg_len) {
        const char *s = fi_cq_strerror(cq, e.prov_errno, e.err_data, NULL, 0);
        snprintf(msg, msg_len, "%s (%s)", fi_strerror(e.err), s ? s : "");
    }
    return ret;
}
