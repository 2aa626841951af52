"""CORA's metric code, copied from AGI-Labs/continual_rl at commit f2754bb282757829765beb4703f24b87efa13ff9,
`continual_rl/utils/metrics.py` (class `Metrics`), as the oracle of tests/test_evaluation_cora.py.

Copied verbatim (indentation and comments kept): `post_processing` (lines 225-259; filter 'ma' and the clip),
`get_rewards_for_region` (449-454), `compute_forgetting_metric` (456-492), `compute_forward_transfer_metric`
(494-521), `get_metric_tags` (523-531), `compute_metrics` (533-559), and the statistics of `plot_metrics` (662-810)
up to the LaTeX. Changed, and only this: the module flags USE_ISOLATED_FORGETTING / USE_ISOLATED_ZSFT are attributes
(`self.use_isolated_forgetting`, `self.use_isolated_zsft`, CORA's values True by default) so both settings can be
tested; the 'ema' and 'smooth' filters (unused by cora_metrics.py) raise; `np.float` (removed in NumPy 1.24) is
`float`; `plot_metrics` returns its tables instead of printing LaTeX. Inputs: `data` = {run_id: {tag: [(step,
value), ...]}} as `read_experiment_data` returns it (steps in order).

CORA's license (MIT):

Copyright (c) 2020 SamNPowers

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""

import collections

import numpy as np
from scipy.stats import sem


class CoraMetrics(object):
    def __init__(self, experiment_data, use_isolated_forgetting=True, use_isolated_zsft=True):
        self._experiment_data = experiment_data
        self.use_isolated_forgetting = use_isolated_forgetting
        self.use_isolated_zsft = use_isolated_zsft

    def post_processing(self, data, tags):
        post_processed_data = {}
        for run_id, d in data.items():
            new_d = {}
            for k in tags:
                if k not in d:
                    continue

                run = d[k]

                xs = np.array([run_datum[0] for run_datum in run])
                ys = [run_datum[1] for run_datum in run]

                if self._experiment_data.get("clip_y_range", None) is not None:
                    clip_range = self._experiment_data["clip_y_range"]
                    ys = np.array(ys).clip(min=clip_range[0], max=clip_range[1])

                if self._experiment_data['filter'] == 'ma':
                    rolling_accumulator = collections.deque(maxlen=self._experiment_data['rolling_mean_count'])
                    for x_id, x in enumerate(xs):
                        rolling_accumulator.append(ys[x_id])
                        ys[x_id] = np.array(rolling_accumulator).mean()
                else:
                    raise ValueError

                processed_run = list(zip(xs, ys))

                new_d[k] = processed_run

            post_processed_data[run_id] = new_d
        return post_processed_data

    def get_rewards_for_region(self, xs, ys, region):
            valid_x_mask_lower = xs > region[0] if region[0] is not None else True  # If we have no lower bound specified, all xs are valid
            valid_x_mask_upper = xs < region[1] if region[1] is not None else True
            valid_x_mask = valid_x_mask_lower * valid_x_mask_upper

            return ys[valid_x_mask]

    def compute_forgetting_metric(self, task_results, task_steps, task_id, num_tasks, num_cycles, return_scale):
        """
        We compute how much is forgotten of task (task_id) as each subsequent (subsequent_task_id) is learned.
        """
        per_run_forgetting_per_subsequent = {id: {} for id in range(num_tasks)}  # Inner dict maps cycle to total

        for run_id, task_result in enumerate(task_results):
            xs = np.array([t[0] for t in task_result])
            ys = np.array([t[1] for t in task_result]) * return_scale

            # Select only the rewards from the region up to and including the training of the given task
            task_rewards = self.get_rewards_for_region(xs, ys, [None, (task_id+1) * task_steps])
            max_task_value = task_rewards.max()

            for cycle_id in range(num_cycles):
                for subsequent_task_id in range(num_tasks):
                    # It's not really "catastrophic forgetting" if we haven't seen the task yet, so skip the early tasks
                    if cycle_id == 0 and subsequent_task_id <= task_id:
                        continue

                    offset = cycle_id * num_tasks

                    if self.use_isolated_forgetting:
                        task_rewards = self.get_rewards_for_region(xs, ys, [None, (subsequent_task_id + offset) * task_steps])
                        max_task_value = task_rewards[-1]

                    subsequent_region = [(subsequent_task_id + offset) * task_steps,
                                         (subsequent_task_id + offset + 1) * task_steps]
                    subsequent_task_rewards = self.get_rewards_for_region(xs, ys, subsequent_region)
                    last_reward = subsequent_task_rewards[-1]
                    forgetting = max_task_value - last_reward

                    if cycle_id not in per_run_forgetting_per_subsequent[subsequent_task_id]:
                        per_run_forgetting_per_subsequent[subsequent_task_id][cycle_id] = []
                    per_run_forgetting_per_subsequent[subsequent_task_id][cycle_id].append(forgetting)

        return per_run_forgetting_per_subsequent

    def compute_forward_transfer_metric(self, task_results, task_steps, prior_task_ids, return_scale):
        """
        We compute how much is learned of task (task_id) by each previous task, before task (task_id) is learned at all.
        """
        per_run_transfer_per_prior = {id: [] for id in prior_task_ids}  # The id maps to task_id, and the entries of the array correspond to separate runs

        for run_id, task_result in enumerate(task_results):
            xs = np.array([t[0] for t in task_result])
            ys = np.array([t[1] for t in task_result]) * return_scale

            # Select only the rewards from the region up to and including the training of the given task
            initial_task_value = ys[0]  # TODO: this isn't necessarily a robust average

            for prior_task_id in prior_task_ids:
                prior_region = [prior_task_id * task_steps, (prior_task_id+1) * task_steps]  # TODO: could do from the end of the task up to the subsequent one we're looking at...
                subsequent_task_rewards = self.get_rewards_for_region(xs, ys, prior_region)
                last_reward = subsequent_task_rewards[-1]
                baseline = initial_task_value

                if self.use_isolated_zsft and prior_task_id > 0:
                    pre_task_region = [0, prior_task_id * task_steps]  # Get the rewards up to and not including our "previous task"
                    subsequent_pre_task_rewards = self.get_rewards_for_region(xs, ys, pre_task_region)
                    baseline = subsequent_pre_task_rewards[-1]

                transfer = last_reward - baseline
                per_run_transfer_per_prior[prior_task_id].append(transfer)

        return per_run_transfer_per_prior

    def get_metric_tags(self):
        """
        Get the tags to be used during computation of metrics. It is assumed that the order is consistent: i.e. tags
        A, B, C, D will be used to compute how much forgetting D causes for B and C.
        :return:
        """
        task_ids = [task["eval_i"] if "eval_i" in task else task["i"] for task in self._experiment_data["tasks"].values()]
        tags = [f"{self._experiment_data['tag_base']}/{id}" for id in task_ids]
        return tags

    def compute_metrics(self, data):
        # Grab the tag ids we will use to evaluate the metrics: if we collected explicit eval data, use that.
        tags = self.get_metric_tags()
        num_tasks = len(tags)
        metrics = {}

        # For each task (labeled by a tag), grab all of the associated runs, then compute the metrics on them
        for task_id, task_tag in enumerate(tags):
            per_task_data = []
            for run_data in data.values():
                per_task_data.append(run_data[task_tag])

            # Scale by the largest (absolute) return seen for this task  # TODO: should only be first cycle
            max_return = np.abs(np.concatenate([np.array([run[1] for run in task]) for task in per_task_data])).max()

            # Compute the amount this task was forgotten by subsequent tasks
            # Forgetting will map task to a dictionary (cycle_id: amount of forgetting)
            per_run_forgetting = self.compute_forgetting_metric(per_task_data, self._experiment_data["num_task_steps"], task_id, num_tasks,
                                                   num_cycles=self._experiment_data.get("num_cycles_for_forgetting", 1), return_scale=1/max_return)

            prior_task_ids = list(range(len(tags)))[:task_id]
            per_run_transfer = self.compute_forward_transfer_metric(per_task_data, self._experiment_data["num_task_steps"], prior_task_ids,
                                                       return_scale=1/max_return)

            metrics[task_tag] = {"forgetting": per_run_forgetting, "transfer": per_run_transfer}

        return metrics

    def plot_metrics(self, metrics, metric_scale=10):
        tags = self.get_metric_tags()
        num_tasks = len(tags)
        num_cycles = self._experiment_data["num_cycles_for_forgetting"]  # TODO: const, it's used a few places. self._experiment_data["num_cycles"]
        # metric_scale = 10  # Consistent across tasks, since they have all been normalized  (a parameter here)
        tables = {}

        for model_name, model_metrics in metrics.items():
            # Pre-allocate our tables
            forgetting_table = [[None for _ in range(num_tasks * num_cycles + 1)] for _ in range(num_tasks + 1)]
            transfer_table = [[None for _ in range(num_tasks + 1)] for _ in range(num_tasks + 1)]  # Zero-shot transfer, so we don't plot all the cycles

            forgetting_error_table = [[None for _ in range(num_tasks * num_cycles + 1)] for _ in range(num_tasks + 1)]
            transfer_error_table = [[None for _ in range(num_tasks + 1)] for _ in range(num_tasks + 1)]  # Zero-shot transfer, so we don't plot all the cycles

            # To ensure our standard error of the mean statistics are using independent data, we average the metrics over the run across the appropriate axis
            task_id_run_aggregates_forgetting = {}  # For a given task id, aggregate the run id data (across impactor)
            impactor_id_run_aggregates_forgetting = {}  # For a given impactor id, aggregate the run id data (across task)

            task_id_run_aggregates_transfer = {}  # For a given task id, aggregate the run id data (across impactor)
            impactor_id_run_aggregates_transfer = {}  # For a given impactor id, aggregate the run id data (across task)

            for task_id, tag in enumerate(tags):
                task_data = model_metrics[tag]

                # Fill in forgetting data. "Impactor" means the task that is causing the change in the current task (subsequent task for forgetting)
                forgetting_data = task_data["forgetting"]

                for impactor_id in range(num_tasks):
                    impact_data = forgetting_data.get(impactor_id, {})

                    for cycle_id in range(num_cycles):
                        impact_cycle_run_data = impact_data.get(cycle_id, None)

                        impact_cycle_data = sum(impact_cycle_run_data) / len(impact_cycle_run_data) if impact_cycle_run_data is not None else None
                        impact_cycle_error = sem(impact_cycle_run_data) if impact_cycle_run_data is not None else None

                        forgetting_table[task_id][cycle_id * num_tasks + impactor_id] = impact_cycle_data * metric_scale if impact_cycle_data is not None else None
                        forgetting_error_table[task_id][cycle_id * num_tasks + impactor_id] = impact_cycle_error * metric_scale if impact_cycle_error is not None else None

                        # Aggregate statistics holding the task_id and impactor_id constant:
                        # First we average the data over the same run, to give us a per-run forgetting statistic
                        if impact_cycle_run_data is not None:
                            for run_id in range(len(impact_cycle_run_data)):
                                # Aggregate by task_id
                                if task_id not in task_id_run_aggregates_forgetting:
                                    task_id_run_aggregates_forgetting[task_id] = {}

                                if run_id not in task_id_run_aggregates_forgetting[task_id]:
                                    task_id_run_aggregates_forgetting[task_id][run_id] = []

                                task_id_run_aggregates_forgetting[task_id][run_id].append(impact_cycle_run_data[run_id])

                                # Aggregate by impactor
                                if impactor_id not in impactor_id_run_aggregates_forgetting:
                                    impactor_id_run_aggregates_forgetting[impactor_id] = {}

                                if run_id not in impactor_id_run_aggregates_forgetting[impactor_id]:
                                    impactor_id_run_aggregates_forgetting[impactor_id][run_id] = []

                                impactor_id_run_aggregates_forgetting[impactor_id][run_id].append(impact_cycle_run_data[run_id])

                # Fill in the transfer data
                transfer_data = task_data["transfer"]
                for impactor_id in range(num_tasks):
                    impact_cycle_run_data = transfer_data.get(impactor_id, None)

                    impact_data = sum(impact_cycle_run_data) / len(impact_cycle_run_data) if impact_cycle_run_data is not None else None
                    impact_error = sem(impact_cycle_run_data) if impact_cycle_run_data is not None else None

                    transfer_table[task_id][impactor_id] = impact_data * metric_scale if impact_data is not None else None
                    transfer_error_table[task_id][impactor_id] = impact_error * metric_scale if impact_data is not None else None

                    # Aggregate statistics holding the task_id and impactor_id constant:
                    # First we average the data over the same run, to give us a per-run forgetting statistic
                    if impact_cycle_run_data is not None:
                        for run_id in range(len(impact_cycle_run_data)):
                            # Aggregate by task_id
                            if task_id not in task_id_run_aggregates_transfer:
                                task_id_run_aggregates_transfer[task_id] = {}

                            if run_id not in task_id_run_aggregates_transfer[task_id]:
                                task_id_run_aggregates_transfer[task_id][run_id] = []

                            task_id_run_aggregates_transfer[task_id][run_id].append(impact_cycle_run_data[run_id])

                            # Aggregate by impactor
                            if impactor_id not in impactor_id_run_aggregates_transfer:
                                impactor_id_run_aggregates_transfer[impactor_id] = {}

                            if run_id not in impactor_id_run_aggregates_transfer[impactor_id]:
                                impactor_id_run_aggregates_transfer[impactor_id][run_id] = []

                            impactor_id_run_aggregates_transfer[impactor_id][run_id].append(impact_cycle_run_data[run_id])

            # Generate consolidated statistics
            for task_id in range(len(forgetting_table)):
                if task_id in task_id_run_aggregates_forgetting:
                    task_id_forgetting = np.array(list(task_id_run_aggregates_forgetting[task_id].values())).mean(axis=1)
                    forgetting_table[task_id][-1] = metric_scale * task_id_forgetting.mean(axis=0)  # Along the axes for consistency with sem
                    forgetting_error_table[task_id][-1] = metric_scale * sem(task_id_forgetting)

                if task_id in task_id_run_aggregates_transfer:
                    task_id_transfer = np.array(list(task_id_run_aggregates_transfer[task_id].values())).mean(axis=1)
                    transfer_table[task_id][-1] = metric_scale * task_id_transfer.mean(axis=0)
                    transfer_error_table[task_id][-1] = metric_scale * sem(task_id_transfer)

                for impactor_id in range(len(forgetting_table[0])):
                    if impactor_id in impactor_id_run_aggregates_forgetting:
                        impactor_id_forgetting = np.array(list(impactor_id_run_aggregates_forgetting[impactor_id].values())).mean(axis=1)
                        forgetting_table[-1][impactor_id] = metric_scale * impactor_id_forgetting.mean(axis=0)
                        forgetting_error_table[-1][impactor_id] = metric_scale * sem(impactor_id_forgetting)

                    if impactor_id in impactor_id_run_aggregates_transfer:
                        impactor_id_transfer = np.array(list(impactor_id_run_aggregates_transfer[impactor_id].values())).mean(axis=1)
                        transfer_table[-1][impactor_id] = metric_scale * impactor_id_transfer.mean(axis=0)
                        transfer_error_table[-1][impactor_id] = metric_scale * sem(impactor_id_transfer)

            forgetting_table = np.array(forgetting_table, dtype=float)
            forgetting_error_table = np.array(forgetting_error_table, dtype=float)

            transfer_table = np.array(transfer_table, dtype=float)
            transfer_error_table = np.array(transfer_error_table, dtype=float)

            # Complete the corners by aggregating all data from each run
            # Forgetting corner
            all_task_id_run_data_forgetting = {}
            for task_id in task_id_run_aggregates_forgetting.keys():
                for run_id in task_id_run_aggregates_forgetting[task_id].keys():
                    if run_id not in all_task_id_run_data_forgetting:
                        all_task_id_run_data_forgetting[run_id] = []

                    all_task_id_run_data_forgetting[run_id].extend(task_id_run_aggregates_forgetting[task_id][run_id])

            all_task_id_run_agg_forgetting = np.array(list(all_task_id_run_data_forgetting.values())).mean(axis=1)
            forgetting_table[-1][-1] = metric_scale * all_task_id_run_agg_forgetting.mean()
            forgetting_error_table[-1][-1] = metric_scale * sem(all_task_id_run_agg_forgetting)

            # Transfer corner
            all_task_id_run_data_transfer = {}
            for task_id in task_id_run_aggregates_transfer.keys():
                for run_id in task_id_run_aggregates_transfer[task_id].keys():
                    if run_id not in all_task_id_run_data_transfer:
                        all_task_id_run_data_transfer[run_id] = []

                    all_task_id_run_data_transfer[run_id].extend(task_id_run_aggregates_transfer[task_id][run_id])

            all_task_id_run_agg_transfer = np.array(list(all_task_id_run_data_transfer.values())).mean(axis=1)
            transfer_table[-1][-1] = metric_scale * all_task_id_run_agg_transfer.mean()
            transfer_error_table[-1][-1] = metric_scale * sem(all_task_id_run_agg_transfer)

            tables[model_name] = {"forgetting": forgetting_table, "forgetting_error": forgetting_error_table,
                                  "transfer": transfer_table, "transfer_error": transfer_error_table}
        return tables


def run_cora(models, num_task_steps, rolling_mean_count, num_cycles_for_forgetting=1, metric_scale=10,
             clip_y_range=None, use_isolated_forgetting=True, use_isolated_zsft=True):
    """CORA's `visualize` minus reading and plotting: models = {model: {run_id: {task: [(step, value), ...]}}}, tasks
    in the order of the first model's first run. Returns (per model: compute_metrics' output, plot_metrics' tables)."""
    first = next(iter(next(iter(models.values())).values()))
    tasks = {t: dict(i=t) for t in first}
    experiment_data = dict(tag_base="eval_reward", tasks=tasks, num_task_steps=num_task_steps, filter="ma",
                           rolling_mean_count=rolling_mean_count, num_cycles_for_forgetting=num_cycles_for_forgetting,
                           clip_y_range=clip_y_range)
    m = CoraMetrics(experiment_data, use_isolated_forgetting, use_isolated_zsft)
    tags = m.get_metric_tags()
    all_metrics = {}
    for model_k, runs in models.items():
        data = {run_id: {f"eval_reward/{t}": curve for t, curve in d.items()} for run_id, d in runs.items()}
        data = m.post_processing(data, tags)
        all_metrics[model_k] = m.compute_metrics(data)
    return all_metrics, m.plot_metrics(all_metrics, metric_scale)
