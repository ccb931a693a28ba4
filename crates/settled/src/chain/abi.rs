//! The contract calls the chain rail makes and the events it reads, as
//! alloy's `sol!` declarations: ABI encoding and decoding are alloy's,
//! never written by hand. The sources of the contracts are in `contracts/`.

use alloy_sol_types::sol;

sol! {
    /// The part of ERC-20 settled calls. `transfer`'s returned bool is not
    /// read: some tokens return nothing, and a revert is what fails.
    interface IERC20 {
        event Transfer(address indexed from, address indexed to, uint256 value);
        function transfer(address to, uint256 value) external;
        function approve(address spender, uint256 value) external returns (bool);
        function allowance(address owner, address spender) external view returns (uint256);
        function balanceOf(address owner) external view returns (uint256);
    }

    /// settled's multi-transfer contract (`contracts/PayMany.sol`).
    interface PayMany {
        error TransferFailed(uint256 index);
        function pay(address token, address[] recipients, uint256[] amounts) external;
    }
}
