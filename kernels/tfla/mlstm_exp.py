"""mLSTMexp public function (being written)."""


def mlstm_exp(*args, **kwargs):
    raise NotImplementedError("tfla.mlstm_exp is being written")
