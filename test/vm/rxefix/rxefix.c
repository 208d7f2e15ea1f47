// SPDX-License-Identifier: GPL-2.0
/*
 * rxefix: works around two bugs of Debian 6.1's rdma_rxe that keep Linux's own
 * SMC-R version 2 from running over soft-RoCE in the test VM (test/vm/linuxsmc):
 *
 * - rxe_qp_to_attr never fills cur_qp_state (fixed upstream in 6.13, 775e6d3c8fda),
 *   and SMC sends on a link only in IB_QPS_RTS: every LLC send fails with -ENOLINK.
 *   A kretprobe copies qp_state into cur_qp_state after it returns.
 * - rxe_cq_post signals a completion only for notify == IB_CQ_NEXT_COMP or
 *   IB_CQ_SOLICITED exactly, and SMC arms its CQs with IB_CQ_SOLICITED_MASK, so no
 *   receive completion ever reaches SMC. A kprobe on rxe_req_notify_cq asks for
 *   IB_CQ_NEXT_COMP instead, which signals every completion.
 */
#include <linux/kprobes.h>
#include <linux/module.h>
#include <rdma/ib_verbs.h>

struct qp_to_attr_call {
	struct ib_qp_attr *attr;
};

/* rxe_qp_to_attr(struct rxe_qp *qp, struct ib_qp_attr *attr, int mask) */
static int qp_to_attr_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	((struct qp_to_attr_call *)ri->data)->attr = (struct ib_qp_attr *)regs->si;
	return 0;
}

static int qp_to_attr_return(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct ib_qp_attr *attr = ((struct qp_to_attr_call *)ri->data)->attr;

	if (attr)
		attr->cur_qp_state = attr->qp_state;
	return 0;
}

static struct kretprobe qp_to_attr_probe = {
	.kp.symbol_name = "rxe_qp_to_attr",
	.entry_handler = qp_to_attr_entry,
	.handler = qp_to_attr_return,
	.data_size = sizeof(struct qp_to_attr_call),
	.maxactive = 64,
};

/* rxe_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags) */
static int req_notify_cq_entry(struct kprobe *p, struct pt_regs *regs)
{
	if ((regs->si & IB_CQ_SOLICITED_MASK) == IB_CQ_SOLICITED_MASK)
		regs->si = (regs->si & ~(unsigned long)IB_CQ_SOLICITED_MASK) | IB_CQ_NEXT_COMP;
	return 0;
}

static struct kprobe req_notify_cq_probe = {
	.symbol_name = "rxe_req_notify_cq",
	.pre_handler = req_notify_cq_entry,
};

static int __init rxefix_init(void)
{
	int rc = register_kretprobe(&qp_to_attr_probe);

	if (rc) {
		pr_err("rxefix: kretprobe on rxe_qp_to_attr: %d\n", rc);
		return rc;
	}
	rc = register_kprobe(&req_notify_cq_probe);
	if (rc) {
		pr_err("rxefix: kprobe on rxe_req_notify_cq: %d\n", rc);
		unregister_kretprobe(&qp_to_attr_probe);
	}
	return rc;
}

static void __exit rxefix_exit(void)
{
	unregister_kprobe(&req_notify_cq_probe);
	unregister_kretprobe(&qp_to_attr_probe);
}

module_init(rxefix_init);
module_exit(rxefix_exit);
MODULE_DESCRIPTION("soft-RoCE fixes for SMC-R v2 on Debian 6.1 (test VM only)");
MODULE_LICENSE("GPL");
